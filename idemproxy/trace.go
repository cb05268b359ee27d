package idemproxy

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the proxy's spans.
const tracerName = "github.com/idem-dev/idem/idemproxy"

// w3c is the propagator of W3C trace context (traceparent, tracestate)
// and baggage, read from clients and passed to the upstream.
var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// tracingTransport starts a client span around each call to the upstream
// and passes its trace context on in the request's headers, so that the
// upstream's own spans join the trace.
type tracingTransport struct {
	next   http.RoundTripper
	tracer trace.Tracer
}

func (t tracingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, span := t.tracer.Start(r.Context(), "idem.upstream", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("server.address", r.URL.Host)))
	defer span.End()
	r = r.Clone(ctx) // a RoundTripper must not change the request it is given
	// The client's headers were read into ctx (Extract) where valid; the
	// upstream gets idem's own, and none of a client's that did not parse
	// (W3C: tracestate goes with a traceparent that is discarded).
	for _, h := range []string{"Traceparent", "Tracestate", "Baggage"} {
		r.Header.Del(h)
	}
	w3c.Inject(ctx, propagation.HeaderCarrier(r.Header))
	resp, err := t.next.RoundTrip(r)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "upstream call failed")
		return resp, err
	}
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, resp.Status)
	}
	return resp, nil
}
