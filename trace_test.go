package idem_test

import (
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// TestMiddlewareSpans: with a TracerProvider, each protected request has
// a span with its outcome, and the store calls are its children.
func TestMiddlewareSpans(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(t.Context()) })
	f := newFixture(t, idem.Config{TracerProvider: tp}, idem.EngineConfig{TracerProvider: tp}, paymentHandler)
	if f.e.Store() != idemstore.Store(f.store) {
		t.Error("Engine.Store is not the store given")
	}
	f.do(call{key: "k"})
	f.do(call{key: "k"})
	f.do(call{noKey: true})
	f.do(call{method: http.MethodGet}) // not protected: no span

	spans := exp.GetSpans()
	var requests []tracetest.SpanStub
	byID := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byID[s.SpanContext.SpanID().String()] = s
		if s.Name == "idem.request" {
			requests = append(requests, s)
		}
	}
	attr := func(s tracetest.SpanStub, k attribute.Key) string {
		for _, a := range s.Attributes {
			if a.Key == k {
				return a.Value.String()
			}
		}
		return ""
	}
	var outcomes []string
	for _, s := range requests {
		outcomes = append(outcomes, attr(s, idem.AttrOutcome))
	}
	if len(outcomes) != 3 || outcomes[0] != "acquired" || outcomes[1] != "replayed" || outcomes[2] != "missing_key" {
		t.Fatalf("request spans' outcomes %v, want [acquired replayed missing_key]", outcomes)
	}
	if attr(requests[0], idem.AttrSettlement) != "completed" || attr(requests[0], "http.response.status_code") != "201" || attr(requests[0], idem.AttrOperation) != "POST /payments" {
		t.Errorf("first request span attributes %v", requests[0].Attributes)
	}
	children := map[string][]string{} // request span ID → store span names
	for _, s := range spans {
		if p, ok := byID[s.Parent.SpanID().String()]; ok && p.Name == "idem.request" {
			children[p.SpanContext.SpanID().String()] = append(children[p.SpanContext.SpanID().String()], s.Name)
		}
	}
	first := children[requests[0].SpanContext.SpanID().String()]
	if len(first) < 2 || first[0] != "idem.store.reserve" || first[len(first)-1] != "idem.store.complete" {
		t.Errorf("store spans under the first request: %v", first)
	}
	if got := children[requests[1].SpanContext.SpanID().String()]; len(got) == 0 || got[0] != "idem.store.reserve" {
		t.Errorf("store spans under the replay: %v", got)
	}
}
