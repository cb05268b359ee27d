package idemproxy

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
)

// ParseLevel parses debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level %q must be debug, info, warn or error", s)
	}
	return l, nil
}

// NewLogger returns a text or JSON logger writing to w at level. Neither
// writes a character a terminal would act on: the text handler quotes
// them, and JSON lines have C1 controls and format characters such as
// bidirectional overrides escaped as \uXXXX, as encoding/json does for the
// C0 controls, so that a request path or key cannot rewrite the log line
// an operator reads.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	return NewLevelLogger(w, format, level, new(slog.LevelVar))
}

// NewLevelLogger is NewLogger with its level in v, set to level, so that
// it can change while the logger is in use (Server.LogLevel).
func NewLevelLogger(w io.Writer, format, level string, v *slog.LevelVar) (*slog.Logger, error) {
	l, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	v.Set(l)
	o := &slog.HandlerOptions{Level: v}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(visibleJSON{w}, o)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, o)), nil
	}
	return nil, fmt.Errorf("log format %q must be text or json", format)
}

// visibleJSON escapes what encoding/json leaves raw in each log line (one
// Write per record).
type visibleJSON struct{ w io.Writer }

func (v visibleJSON) Write(b []byte) (int, error) {
	if _, err := v.w.Write(idemadmin.VisibleJSON(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// keyDigest names ev's key on a log line by its digest (idem.KeyDigest),
// never in clear; an empty attribute (which handlers leave out) when the
// request sent no valid key.
func keyDigest(ev idem.Event) slog.Attr {
	if ev.Key == "" {
		return slog.Attr{}
	}
	return slog.String("key_digest", idem.KeyDigest(idem.Key{Scope: ev.Scope, Operation: ev.Operation, Key: ev.Key}))
}
