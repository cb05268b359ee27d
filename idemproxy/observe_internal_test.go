package idemproxy

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// TestFindingLogSamples: one line per route and finding every
// findingLogEvery, which then says how many it left out.
func TestFindingLogSamples(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := newFindingLog(slog.New(slog.NewTextHandler(&buf, nil)))
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	ev := func(f string) idem.Event {
		return idem.Event{Operation: "POST /pay", Finding: f, Key: "k", Status: 201}
	}
	for range 5 {
		l.note("POST /pay", ev(idem.FindingMissingKey))
	}
	l.note("POST /pay", ev(idem.FindingWouldReplay))
	l.note("default", ev(idem.FindingMissingKey))
	now = now.Add(findingLogEvery - time.Nanosecond)
	l.note("POST /pay", ev(idem.FindingMissingKey))
	now = now.Add(time.Nanosecond)
	l.note("POST /pay", ev(idem.FindingMissingKey))
	// The key by its digest, never in clear (see idem.KeyDigest).
	digest := idem.KeyDigest(idem.Key{Operation: "POST /pay", Key: "k"})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(lines), buf.String())
	}
	for i, want := range []string{
		`route="POST /pay" finding=missing_key operation="POST /pay" key_digest=` + digest + ` status=201 unlogged_since_last=0`,
		`route="POST /pay" finding=would_replay`,
		`route=default finding=missing_key`,
		`route="POST /pay" finding=missing_key operation="POST /pay" key_digest=` + digest + ` status=201 unlogged_since_last=5`,
	} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d = %s, want %s", i, lines[i], want)
		}
	}
}

func TestParseMode(t *testing.T) {
	t.Parallel()
	c, err := ParseConfig([]byte("upstream: http://u\nmode: observe\nroutes:\n  - match: POST /a\n    mode: enforce\n  - match: POST /b\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Settings.policy().Observe || c.Routes[0].Settings.merge(c.Settings).policy().Observe || !c.Routes[1].Settings.merge(c.Settings).policy().Observe {
		t.Errorf("modes: global %q, routes %q %q", c.Mode, c.Routes[0].Mode, c.Routes[1].Mode)
	}
	if _, err := ParseConfig([]byte("upstream: http://u\nmode: watch\n")); err == nil || !strings.Contains(err.Error(), "line 2: mode must be enforce or observe") {
		t.Errorf("mode: watch: %v", err)
	}
}
