package idemproxy_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/rpctest/testpb/testpbconnect"
)

// TestRPCTracing: a protected gRPC-family call has an idem.request span,
// as an HTTP request does, with its operation, outcome and settlement,
// over the store's and the upstream call's spans.
func TestRPCTracing(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(t.Context()) })
	pay := newPayments()
	up := startUpstream(t, pay)
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemproxy.New(engine, idemproxy.Config{Upstream: "http://" + up, Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared}},
		idemproxy.Options{Logger: slog.New(slog.DiscardHandler), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	c := testpbconnect.NewPaymentsClient(&http.Client{Transport: &http.Transport{}}, front.URL)
	for range 2 {
		req := connect.NewRequest(&testpb.ChargeRequest{Account: "traced"})
		req.Header().Set("Idempotency-Key", "tr-1")
		if _, err := c.Charge(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	var outcomes []string
	upstreamUnder := false
	for _, s := range exp.GetSpans() {
		if s.Name != "idem.request" {
			continue
		}
		attrs := attribute.NewSet(s.Attributes...)
		o, _ := attrs.Value(idem.AttrOutcome)
		outcomes = append(outcomes, o.AsString())
		if st, _ := attrs.Value(idem.AttrSettlement); o.AsString() == "acquired" && st.AsString() != "completed" {
			t.Errorf("the first call's settlement: %q", st.AsString())
		}
		for _, child := range exp.GetSpans() {
			if child.Name == "idem.upstream" && child.Parent.SpanID() == s.SpanContext.SpanID() {
				upstreamUnder = true
			}
		}
	}
	if len(outcomes) != 2 || outcomes[0] != "acquired" || outcomes[1] != "replayed" {
		t.Errorf("idem.request spans' outcomes: %v", outcomes)
	}
	if !upstreamUnder {
		t.Error("no idem.upstream span under an idem.request span")
	}
}
