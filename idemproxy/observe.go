package idemproxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem"
)

// Mode is how a route is protected: enforced, or only observed.
type Mode string

// The modes.
const (
	// ModeEnforce answers duplicates, conflicts and requests without a key
	// itself (replay, 409, 422, 400). The default.
	ModeEnforce Mode = "enforce"
	// ModeObserve forwards every request unchanged and passes on every
	// answer of the upstream's, while it reserves and completes keys as
	// usual and counts what enforcement would have done in
	// idem_observe_findings_total{route,finding} (see idem.Policy.Observe
	// and docs/adoption.md).
	ModeObserve Mode = "observe"
)

// ParseMode parses "enforce" or "observe".
func ParseMode(s string) (Mode, error) {
	switch v := Mode(s); v {
	case ModeEnforce, ModeObserve:
		return v, nil
	}
	return "", fmt.Errorf("mode must be enforce or observe, got %q", s)
}

// UnmarshalYAML checks the mode's name.
func (m *Mode) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseMode(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*m = v
	return nil
}

// DefaultRouteLabel is the route label, in idem_observe_findings_total, of
// the requests no route matches.
const DefaultRouteLabel = "default"

// findingLogEvery is how often at most a finding is logged per route: a
// client that never sends keys would otherwise log every request.
const findingLogEvery = 10 * time.Second

// findingLog logs observe-mode findings, at most one line per route and
// finding every findingLogEvery, saying how many it left out meanwhile.
type findingLog struct {
	log *slog.Logger
	now func() time.Time

	mu   sync.Mutex
	seen map[[2]string]*findingSeen
}

type findingSeen struct {
	last    time.Time
	skipped int
}

func newFindingLog(log *slog.Logger) *findingLog {
	return &findingLog{log: log, now: time.Now, seen: make(map[[2]string]*findingSeen)}
}

// note logs ev's finding on route, unless one was logged lately.
func (l *findingLog) note(route string, ev idem.Event) {
	now := l.now()
	k := [2]string{route, ev.Finding}
	l.mu.Lock()
	s := l.seen[k]
	if s == nil {
		s = &findingSeen{}
		l.seen[k] = s
	}
	if !s.last.IsZero() && now.Sub(s.last) < findingLogEvery {
		s.skipped++
		l.mu.Unlock()
		return
	}
	skipped := s.skipped
	s.last, s.skipped = now, 0
	l.mu.Unlock()
	l.log.LogAttrs(context.Background(), slog.LevelInfo, "observe: enforcement would have answered this request itself",
		slog.String("route", route), slog.String("finding", ev.Finding), slog.String("operation", ev.Operation),
		keyDigest(ev), slog.Int("status", ev.Status), slog.Int("unlogged_since_last", skipped))
}
