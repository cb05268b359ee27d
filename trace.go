package idem

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/idemstore"
)

// Tracing with OpenTelemetry is off unless a TracerProvider is given:
// Config.TracerProvider makes the middleware start a span per protected
// request ("idem.request", with the outcome), and EngineConfig.TracerProvider
// a child span per store call ("idem.store.reserve", …). Without them idem
// starts no span and allocates nothing for tracing.

// tracerName is the instrumentation scope of idem's spans.
const tracerName = "github.com/idem-dev/idem"

// Span attributes.
const (
	AttrOperation  = attribute.Key("idem.operation")
	AttrOutcome    = attribute.Key("idem.outcome")
	AttrSettlement = attribute.Key("idem.settlement")
	AttrFinding    = attribute.Key("idem.finding")
	attrStatus     = attribute.Key("http.response.status_code")
)

// startRequestSpan starts the middleware's span for r, or returns r as it
// is and a nil end when tracing is off.
func (m *middleware) startRequestSpan(r *http.Request, op string) (*http.Request, trace.Span) {
	if m.tracer == nil {
		return r, nil
	}
	ctx, span := m.tracer.Start(r.Context(), "idem.request", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrOperation.String(op)))
	return r.WithContext(ctx), span
}

// endRequestSpan records ev on span and ends it.
func endRequestSpan(span trace.Span, ev *Event) {
	attrs := []attribute.KeyValue{AttrOutcome.String(ev.Outcome), attrStatus.Int(ev.Status)}
	if ev.Settlement != "" {
		attrs = append(attrs, AttrSettlement.String(ev.Settlement))
	}
	if ev.Finding != "" {
		attrs = append(attrs, AttrFinding.String(ev.Finding))
	}
	span.SetAttributes(attrs...)
	if ev.Outcome == SituationUnavailable.Name || ev.Settlement == settledFailed || ev.Status >= 500 {
		span.SetStatus(codes.Error, ev.Outcome)
	}
	span.End()
}

// tracedStore starts a span around every call of a store.
type tracedStore struct {
	s idemstore.Store
	t trace.Tracer
}

// tracedNotifier is a tracedStore whose store notifies.
type tracedNotifier struct {
	*tracedStore
	n idemstore.Notifier
}

func (tn *tracedNotifier) Subscribe(ctx context.Context, key idemstore.Key) (<-chan struct{}, func(), error) {
	return tn.n.Subscribe(ctx, key)
}

func traceStore(s idemstore.Store, t trace.Tracer) idemstore.Store {
	ts := &tracedStore{s: s, t: t}
	if n, ok := s.(idemstore.Notifier); ok {
		return &tracedNotifier{tracedStore: ts, n: n}
	}
	return ts
}

func (ts *tracedStore) start(ctx context.Context, name string, key *idemstore.Key) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
	if key != nil {
		opts = append(opts, trace.WithAttributes(AttrOperation.String(key.Operation)))
	}
	return ts.t.Start(ctx, name, opts...)
}

// end ends span, an error recorded unless it is an expected answer.
func end(span trace.Span, err error) {
	if err != nil && !errors.Is(err, idemstore.ErrNotFound) && !errors.Is(err, idemstore.ErrLeaseLost) {
		span.RecordError(err)
		span.SetStatus(codes.Error, "store call failed")
	}
	span.End()
}

func (ts *tracedStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	ctx, span := ts.start(ctx, "idem.store.reserve", &p.Key)
	rec, created, err := ts.s.Reserve(ctx, p)
	span.SetAttributes(attribute.Bool("idem.store.created", created))
	end(span, err)
	return rec, created, err
}

// ReadResponse implements idemstore.ResponseReader, through the wrapped
// store's (a store without it never leaves an answer out).
func (ts *tracedStore) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	ctx, span := ts.start(ctx, "idem.store.read_response", &key)
	resp, err := idemstore.ReadResponse(ctx, ts.s, key, token)
	end(span, err)
	return resp, err
}

// GetHead implements idemstore.HeadReader, through the wrapped store's
// (or its Get).
func (ts *tracedStore) GetHead(ctx context.Context, key idemstore.Key, inline int) (*idemstore.Record, error) {
	ctx, span := ts.start(ctx, "idem.store.get", &key)
	rec, err := idemstore.GetHead(ctx, ts.s, key, inline)
	end(span, err)
	return rec, err
}

func (ts *tracedStore) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	ctx, span := ts.start(ctx, "idem.store.get", &key)
	rec, err := ts.s.Get(ctx, key)
	end(span, err)
	return rec, err
}

func (ts *tracedStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	ctx, span := ts.start(ctx, "idem.store.complete", &p.Key)
	err := ts.s.Complete(ctx, p)
	end(span, err)
	return err
}

func (ts *tracedStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	ctx, span := ts.start(ctx, "idem.store.release", &p.Key)
	err := ts.s.Release(ctx, p)
	end(span, err)
	return err
}

func (ts *tracedStore) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	ctx, span := ts.start(ctx, "idem.store.escalate", &p.Key)
	err := ts.s.Escalate(ctx, p)
	end(span, err)
	return err
}

func (ts *tracedStore) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	ctx, span := ts.start(ctx, "idem.store.extend", &p.Key)
	err := ts.s.Extend(ctx, p)
	end(span, err)
	return err
}

func (ts *tracedStore) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	ctx, span := ts.start(ctx, "idem.store.takeover", &p.Key)
	err := ts.s.Takeover(ctx, p)
	end(span, err)
	return err
}

func (ts *tracedStore) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	ctx, span := ts.start(ctx, "idem.store.resolve", &p.Key)
	err := ts.s.Resolve(ctx, p)
	end(span, err)
	return err
}

func (ts *tracedStore) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	ctx, span := ts.start(ctx, "idem.store.delete", &p.Key)
	err := ts.s.Delete(ctx, p)
	end(span, err)
	return err
}

func (ts *tracedStore) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	ctx, span := ts.start(ctx, "idem.store.list_expired", nil)
	recs, err := ts.s.ListExpiredLeases(ctx, limit)
	end(span, err)
	return recs, err
}

func (ts *tracedStore) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	ctx, span := ts.start(ctx, "idem.store.list", nil)
	page, err := ts.s.List(ctx, p)
	end(span, err)
	return page, err
}

func (ts *tracedStore) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	ctx, span := ts.start(ctx, "idem.store.purge", nil)
	n, err := ts.s.Purge(ctx, p)
	end(span, err)
	return n, err
}

func (ts *tracedStore) Capabilities() idemstore.Capabilities { return ts.s.Capabilities() }
