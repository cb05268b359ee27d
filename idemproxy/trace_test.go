package idemproxy_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// TestProxyTracing: a protected request continues the client's trace, has
// an idem.request span with its outcome over the store's and the upstream
// call's spans, and the upstream gets the trace context.
func TestProxyTracing(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(t.Context()) })

	var mu sync.Mutex
	var got []string // traceparent headers the upstream received
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(upstream.Close)
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemproxy.New(engine, idemproxy.Config{Upstream: upstream.URL, Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared}},
		idemproxy.Options{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)

	// The client's own span, sent as a W3C traceparent.
	clientCtx, clientSpan := tp.Tracer("client").Start(t.Context(), "client")
	req, _ := http.NewRequestWithContext(clientCtx, http.MethodPost, front.URL+"/pay", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "k")
	propagation.TraceContext{}.Inject(clientCtx, propagation.HeaderCarrier(req.Header))
	resp, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	clientSpan.End()
	traceID := clientSpan.SpanContext().TraceID()

	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !strings.Contains(got[0], traceID.String()) {
		t.Fatalf("the upstream got traceparent %v, want trace %s", got, traceID)
	}
	spans := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %s is in trace %s, not the client's", s.Name, s.SpanContext.TraceID())
		}
		spans[s.Name] = s
	}
	reqSpan, ok := spans["idem.request"]
	if !ok {
		t.Fatalf("no idem.request span among %v", exp.GetSpans())
	}
	if reqSpan.Parent.SpanID() != clientSpan.SpanContext().SpanID() {
		t.Error("idem.request is not a child of the client's span")
	}
	outcome := ""
	for _, a := range reqSpan.Attributes {
		if a.Key == idem.AttrOutcome {
			outcome = a.Value.AsString()
		}
	}
	if outcome != "acquired" {
		t.Errorf("idem.request outcome %q", outcome)
	}
	for _, name := range []string{"idem.store.reserve", "idem.store.complete", "idem.upstream"} {
		s, ok := spans[name]
		if !ok {
			t.Errorf("no %s span", name)
			continue
		}
		if s.Parent.SpanID() != reqSpan.SpanContext.SpanID() {
			t.Errorf("%s is not a child of idem.request", name)
		}
	}
	up := spans["idem.upstream"]
	if up.SpanKind != trace.SpanKindClient || !strings.Contains(got[0], up.SpanContext.SpanID().String()) {
		t.Errorf("the upstream's traceparent %s is not the idem.upstream span's", got[0])
	}
}
