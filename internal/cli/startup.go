package cli

import (
	"context"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemproxy"
)

// startupSummary is the line idem serve logs once its listeners are up:
// what an operator looks for first. It names the admin tokens, never
// their values.
type startupSummary struct {
	cfg idemproxy.Config
	// tokens are the names of the admin tokens loaded.
	tokens []string
}

// newStartupSummary reads which admin tokens cfg and env give the admin
// listener: the names of its token file's and of IDEM_ADMIN_TOKEN's (the
// files were checked before).
func newStartupSummary(cfg idemproxy.Config, env map[string]string) startupSummary {
	s := startupSummary{cfg: cfg}
	if cfg.Admin == "" {
		return s // the admin listener is off, and its tokens with it
	}
	names := map[string]bool{}
	if cfg.AdminTokenFile != "" {
		if tokens, err := idemadmin.LoadTokenFile(cfg.AdminTokenFile); err == nil {
			for name := range tokens {
				names[name] = true
			}
		}
	}
	for name := range env {
		names[name] = true
	}
	for name := range names {
		s.tokens = append(s.tokens, name)
	}
	sort.Strings(s.tokens)
	return s
}

// log writes the summary, given the admin listener's address (nil when
// it is off).
func (s startupSummary) log(log *slog.Logger, admin net.Addr) {
	tokens := "none"
	if len(s.tokens) > 0 {
		tokens = strings.Join(s.tokens, ",")
	}
	log.LogAttrs(context.Background(), slog.LevelInfo, "idem serve ready",
		slog.String("review_page", reviewPage(admin, len(s.tokens) > 0)),
		slog.String("admin_tokens", tokens),
		slog.String("observe", observed(s.cfg)))
}

// reviewPage is the review page's URL on the admin listener, or why there
// is none.
func reviewPage(admin net.Addr, tokens bool) string {
	switch {
	case admin == nil:
		return "off (no --admin listener)"
	case !tokens:
		return "off (no admin token: --admin-token-file or IDEM_ADMIN_TOKEN)"
	}
	host := admin.String()
	if a, ok := admin.(*net.TCPAddr); ok && a.IP.IsUnspecified() {
		// Bound to every interface: this host reaches it as localhost.
		host = net.JoinHostPort("localhost", strconv.Itoa(a.Port))
	}
	return "http://" + host + "/"
}

// observed says which requests run in observe mode, forwarded unchanged
// and unprotected: "none", "all", or the routes' patterns (and "requests
// no route matches" when the global mode is observe).
func observed(cfg idemproxy.Config) string {
	global := cfg.Mode == idemproxy.ModeObserve
	var parts []string
	enforced := false
	for _, r := range cfg.Routes {
		if r.Disabled {
			continue
		}
		if r.Mode == idemproxy.ModeObserve || r.Mode == "" && global {
			parts = append(parts, r.Match.Pattern)
		} else {
			enforced = true
		}
	}
	switch {
	case global && !enforced:
		return "all"
	case global:
		parts = append(parts, "requests no route matches")
	case len(parts) == 0:
		return "none"
	}
	return strings.Join(parts, "; ")
}
