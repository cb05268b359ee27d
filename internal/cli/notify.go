package cli

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
)

// notifier tells the service manager how idem serve is doing, by systemd's
// sd_notify protocol: one datagram per state change ("READY=1" once the
// listeners accept connections, "STOPPING=1" when draining starts) on the
// unixgram socket that $NOTIFY_SOCKET names. With the variable unset (not
// under systemd, or a unit of another Type) it does nothing. A unit with
// Type=notify counts idem as started only once READY=1 arrives, so units
// ordered after it find the proxy listening.
type notifier struct {
	socket string
	log    *slog.Logger
}

// newNotifier reads $NOTIFY_SOCKET: an absolute path, or "@name" for an
// abstract socket (Go's net package maps the "@" itself).
func newNotifier(log *slog.Logger) notifier {
	return notifier{socket: os.Getenv("NOTIFY_SOCKET"), log: log}
}

// notify sends state; a failure is logged, never fatal: the proxy serves
// whether or not the service manager hears of it.
func (n notifier) notify(state string) {
	if n.socket == "" {
		return
	}
	if err := sdNotify(n.socket, state); err != nil {
		n.log.Warn("telling the service manager failed ($NOTIFY_SOCKET)", slog.String("state", strings.ReplaceAll(state, "\n", " ")), slog.Any("error", err))
	}
}

// stoppingOn sends STOPPING=1 once ctx ends (SIGTERM or SIGINT), when the
// proxy starts to drain; stop cancels that.
func (n notifier) stoppingOn(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() { n.notify("STOPPING=1") })
}

// sdNotify sends one datagram holding state to the unixgram socket at
// socket (a path, or "@name" for an abstract one).
func sdNotify(socket, state string) error {
	if !strings.HasPrefix(socket, "/") && !strings.HasPrefix(socket, "@") {
		return errors.New("NOTIFY_SOCKET is neither an absolute path nor @abstract: " + socket)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}
