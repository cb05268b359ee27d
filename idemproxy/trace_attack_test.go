package idemproxy_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// spanCounter is a span processor that notes which spans started and
// which ended.
type spanCounter struct {
	mu      sync.Mutex
	started map[trace.SpanID]string
	ended   map[trace.SpanID]bool
}

func (c *spanCounter) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	c.mu.Lock()
	c.started[s.SpanContext().SpanID()] = s.Name()
	c.mu.Unlock()
}

func (c *spanCounter) OnEnd(s sdktrace.ReadOnlySpan) {
	c.mu.Lock()
	c.ended[s.SpanContext().SpanID()] = true
	c.mu.Unlock()
}

func (*spanCounter) Shutdown(context.Context) error   { return nil }
func (*spanCounter) ForceFlush(context.Context) error { return nil }

// TestTracingHostileAndBrokenPaths: with tracing on, a hostile or
// malformed traceparent breaks nothing and is never passed on as it is (the
// upstream gets a valid one of idem's), and every span ends, whether the
// upstream answers, is cut short mid-answer, or the client leaves before
// the answer.
func TestTracingHostileAndBrokenPaths(t *testing.T) {
	t.Parallel()
	sc := &spanCounter{started: map[trace.SpanID]string{}, ended: map[trace.SpanID]bool{}}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sc))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })

	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	var mu sync.Mutex
	var got, states []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Traceparent"))
		states = append(states, r.Header.Get("Tracestate"))
		mu.Unlock()
		switch r.URL.Path {
		case "/cut":
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "partial")
			panic(http.ErrAbortHandler)
		case "/slow":
			arrived <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(upstream.Close)
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemproxy.New(engine, idemproxy.Config{Upstream: upstream.URL, Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared},
		Routes: []idemproxy.Route{{Match: idemproxy.Pattern{Pattern: "POST /observed"}, Settings: idemproxy.Settings{Mode: idemproxy.ModeObserve}}}},
		idemproxy.Options{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)

	hostile := []string{
		"00-00000000000000000000000000000000-0000000000000000-01",
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
		"00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
		strings.Repeat("00-", 3000),
		"💥",
		"",
	}
	for i, tpv := range hostile {
		for _, path := range []string{"/pay", "/observed"} {
			req, _ := http.NewRequest(http.MethodPost, front.URL+path, strings.NewReader("{}"))
			req.Header.Set("Idempotency-Key", "k"+string(rune('a'+i)))
			req.Header["Traceparent"] = []string{tpv, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
			req.Header.Set("Tracestate", "=,,,"+strings.Repeat("a=b,", 100))
			req.Header.Set("Baggage", strings.Repeat("k=v,", 5000))
			resp, err := front.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("traceparent %.40q on %s: %d", tpv, path, resp.StatusCode)
			}
		}
	}
	mu.Lock()
	for _, st := range states {
		if strings.HasPrefix(st, "=,,,") {
			t.Errorf("the client's malformed tracestate was passed on: %.40q", st)
		}
	}
	for _, g := range got {
		if len(g) != 55 || !strings.HasPrefix(g, "00-") {
			t.Errorf("the upstream got traceparent %.60q", g)
		}
		for _, h := range hostile[:5] {
			if g == h {
				t.Errorf("the client's traceparent %q was passed on as it is", h)
			}
		}
	}
	mu.Unlock()

	// An answer cut short after its headers.
	cut, _ := http.NewRequest(http.MethodPost, front.URL+"/cut", strings.NewReader("{}"))
	cut.Header.Set("Idempotency-Key", "cut")
	if resp, err := front.Client().Do(cut); err == nil {
		resp.Body.Close()
	}

	// A client that leaves before the upstream answers.
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/slow", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "slow")
	done := make(chan struct{})
	go func() {
		if resp, err := front.Client().Do(req); err == nil {
			resp.Body.Close()
		}
		close(done)
	}()
	<-arrived
	cancel()
	<-done
	close(release)
	front.Close() // waits for every handler to return

	sc.mu.Lock()
	defer sc.mu.Unlock()
	if len(sc.started) == 0 {
		t.Fatal("no span started")
	}
	for id, name := range sc.started {
		if !sc.ended[id] {
			t.Errorf("span %s never ended", name)
		}
	}
}
