package cli

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/idem-dev/idem/idemproxy"
)

// reloadOnHUP reloads the server's configuration each time hup fires, until
// ctx ends: load reads the file again and applies the command line over it.
// A configuration with an error is refused and logged; the running one
// stays.
func reloadOnHUP(ctx context.Context, hup <-chan os.Signal, s *idemproxy.Server, log *slog.Logger, load func() (idemproxy.Config, error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		cfg, err := load()
		if err != nil {
			log.Error("SIGHUP: the configuration was not reloaded; the running one stays", slog.Any("error", err))
			continue
		}
		restart, err := s.Reload(cfg)
		if err != nil {
			log.Error("SIGHUP: the configuration was not reloaded; the running one stays", slog.Any("error", err))
			continue
		}
		attrs := []any{slog.Int("routes", len(cfg.Routes)), slog.String("log_level", cfg.LogLevel)}
		if len(restart) > 0 {
			log.Warn("SIGHUP: these settings changed but need a restart; they keep their running values", slog.String("settings", strings.Join(restart, ",")))
		}
		log.Info("configuration reloaded", attrs...)
	}
}
