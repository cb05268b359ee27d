package idemclient_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/idemmem"
)

// fakeTime is the Transport's clock in tests: sleeping advances it at once
// and records the wait.
type fakeTime struct {
	mu    sync.Mutex
	now   time.Time
	slept []time.Duration
	// onSleep, if set, runs on each wait (n counts from 1) before it
	// returns; an error ends the wait with it.
	onSleep func(ctx context.Context, n int, d time.Duration) error
}

func (f *fakeTime) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTime) Sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.slept = append(f.slept, d)
	n := len(f.slept)
	f.now = f.now.Add(d)
	hook := f.onSleep
	f.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, n, d); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (f *fakeTime) Slept() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.slept...)
}

// newTransport returns a Transport on fake time whose backoff waits its
// whole bound (no randomness), over a real http.Transport.
func newTransport(t *testing.T) (*idemclient.Transport, *fakeTime) {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr := &idemclient.Transport{Base: base, Logger: slog.New(slog.DiscardHandler)}
	ft := &fakeTime{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	idemclient.SetTime(tr, ft.Now, ft.Sleep)
	idemclient.SetJitter(tr, func(bound time.Duration) time.Duration { return bound })
	return tr, ft
}

// newEngine returns an engine over a fresh memory store.
func newEngine(t *testing.T, cfg idem.EngineConfig) *idem.Engine {
	t.Helper()
	st := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { st.Close() })
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e, err := idem.NewEngine(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// scripted is a server that answers each request with the next of its
// answers (the last one repeats), and records the keys and bodies it got.
type scripted struct {
	mu      sync.Mutex
	answers []func(w http.ResponseWriter, r *http.Request)
	keys    []string
	bodies  []string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.keys)
	s.keys = append(s.keys, r.Header.Get(idem.HeaderName))
	s.bodies = append(s.bodies, string(b))
	answer := s.answers[min(n, len(s.answers)-1)]
	s.mu.Unlock()
	answer(w, r)
}

func (s *scripted) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func (s *scripted) Bodies() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

func newScripted(t *testing.T, answers ...func(w http.ResponseWriter, r *http.Request)) (*scripted, *httptest.Server) {
	t.Helper()
	s := &scripted{answers: answers}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv
}

// status answers code with header pairs (name, value, …) and body.
func status(code int, body string, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

// drop closes the connection without an answer.
func drop(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// allSame reports whether keys are all the same non-empty key.
func allSame(keys []string) bool {
	for _, k := range keys {
		if k == "" || k != keys[0] {
			return false
		}
	}
	return len(keys) > 0
}
