package idemproxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// Metrics are the proxy's Prometheus metrics, in their own registry.
type Metrics struct {
	// Registry holds the metrics below and the Go runtime collectors.
	Registry *prometheus.Registry

	outcomes *prometheus.CounterVec
	findings *prometheus.CounterVec
	store    *prometheus.HistogramVec
	upstream *prometheus.HistogramVec
	// newKeysRefused counts new keys refused by new_keys_per_scope.
	newKeysRefused *prometheus.CounterVec
}

// NewMetrics registers the proxy's metrics in a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_proxy_requests_total",
			Help: "Protected requests by route (its match pattern, or default; empty for a request refused before a route was chosen), by outcome, named as in the Idempotency-Outcome header (acquired, replayed, mismatch, in_flight, needs_review, missing_key, unavailable, upstream_unreachable, upstream_failed, upstream_timeout, shutting_down, …) and, for acquired ones and the proxy's own answers, what became of the key (completed, released, escalated, lost, failed).",
		}, []string{"route", "outcome", "settlement"}),
		findings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_observe_findings_total",
			Help: "Requests on routes in observe mode that enforcement would have answered itself, by route (its match pattern, or default) and finding: missing_key, invalid_key (400), would_replay (the stored answer), would_conflict (422), would_wait (409 in flight), would_review (409 needs review), would_refuse (401, 413, 414).",
		}, []string{"route", "finding"}),
		store: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_store_duration_seconds",
			Help:    "Latency of store calls by operation and result.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"op", "result"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_upstream_duration_seconds",
			Help:    "Time to the upstream's response headers, by status class (2xx … 5xx) or error.",
			Buckets: prometheus.DefBuckets,
		}, []string{"code"}),
		newKeysRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_proxy_new_keys_refused_total",
			Help: "New keys refused (429 too_many_new_keys, nothing forwarded) because their scope had reserved as many as new_keys_per_scope allows in its interval, by route (its match pattern, or default).",
		}, []string{"route"}),
	}
	m.Registry.MustRegister(m.outcomes, m.findings, m.store, m.upstream, m.newKeysRefused,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// WatchBatches adds the group commit counters of a store that batches (see
// idemstore.BatchReporter) to the registry: idem_store_batches_total,
// idem_store_batched_calls_total and idem_store_unbatched_calls_total. They
// are read at each scrape and left out while the store reports batching
// off or is not connected yet. Call it at most once per Metrics: a second
// registration panics.
func (m *Metrics) WatchBatches(r idemstore.BatchReporter) {
	m.Registry.MustRegister(batchCollector{r})
}

var (
	batchesDesc = prometheus.NewDesc("idem_store_batches_total",
		"Batches of the store's group commit: calls that queued while the store was busy, run together in one transaction.", nil, nil)
	batchedDesc = prometheus.NewDesc("idem_store_batched_calls_total",
		"Calls (reserve, complete, release, escalate, extend) carried by those transactions; divided by idem_store_batches_total, the mean batch size.", nil, nil)
	unbatchedDesc = prometheus.NewDesc("idem_store_unbatched_calls_total",
		"Calls of the kinds the store batches that found it idle and ran at once, alone.", nil, nil)
)

type batchCollector struct{ r idemstore.BatchReporter }

func (c batchCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- batchesDesc
	ch <- batchedDesc
	ch <- unbatchedDesc
}

func (c batchCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.r.BatchStats()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(batchesDesc, prometheus.CounterValue, float64(st.Batches))
	ch <- prometheus.MustNewConstMetric(batchedDesc, prometheus.CounterValue, float64(st.Batched))
	ch <- prometheus.MustNewConstMetric(unbatchedDesc, prometheus.CounterValue, float64(st.Alone))
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

func (m *Metrics) observeOutcome(route string, ev idem.Event) {
	m.outcomes.WithLabelValues(route, ev.Outcome, ev.Settlement).Inc()
}

// observeRoute makes the route's findings show, at zero, before any.
func (m *Metrics) observeRoute(route string) {
	for _, f := range idem.Findings() {
		m.findings.WithLabelValues(route, f)
	}
}

func (m *Metrics) observeFinding(route, finding string) {
	m.findings.WithLabelValues(route, finding).Inc()
}

// observeAnswer counts an answer the proxy made itself (an upstream failure,
// shutdown) by its situation, with what became of the key.
func (m *Metrics) observeAnswer(route string, s idem.Situation, settlement string) {
	m.outcomes.WithLabelValues(route, s.Name, settlement).Inc()
}

type instrumentedTransport struct {
	next    http.RoundTripper
	byClass [6]prometheus.Observer
	errs    prometheus.Observer
}

func (m *Metrics) instrumentTransport(next http.RoundTripper) http.RoundTripper {
	t := &instrumentedTransport{next: next, errs: m.upstream.WithLabelValues("error")}
	for i := 1; i < 6; i++ {
		t.byClass[i] = m.upstream.WithLabelValues(strconv.Itoa(i) + "xx")
	}
	return t
}

func (t *instrumentedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	d := time.Since(start).Seconds()
	if err != nil || resp.StatusCode < 100 || resp.StatusCode > 599 {
		t.errs.Observe(d)
	} else {
		t.byClass[resp.StatusCode/100].Observe(d)
	}
	return resp, err
}

// InstrumentStore returns s timed into the store latency histogram. The
// result implements idemstore.Notifier when s does.
func (m *Metrics) InstrumentStore(s idemstore.Store) idemstore.Store {
	is := &instrumentedStore{s: s, m: m}
	for op, name := range opNames {
		is.obs[op] = [2]prometheus.Observer{m.store.WithLabelValues(name, "ok"), m.store.WithLabelValues(name, "error")}
	}
	if n, ok := s.(idemstore.Notifier); ok {
		return &instrumentedNotifier{instrumentedStore: is, n: n}
	}
	return is
}

// Store operations, as labelled in idem_store_duration_seconds.
const (
	opReserve = iota
	opGet
	opComplete
	opRelease
	opEscalate
	opExtend
	opTakeover
	opResolve
	opListExpired
	opList
	opPurge
	opDelete
	opReadResponse
	numOps
)

var opNames = [numOps]string{"reserve", "get", "complete", "release", "escalate", "extend", "takeover", "resolve", "list_expired", "list", "purge", "delete", "read_response"}

type instrumentedStore struct {
	s   idemstore.Store
	m   *Metrics
	obs [numOps][2]prometheus.Observer
}

func (is *instrumentedStore) observe(op int, start time.Time, err error) {
	i := 0
	if err != nil && !errors.Is(err, idemstore.ErrNotFound) && !errors.Is(err, idemstore.ErrLeaseLost) {
		i = 1
	}
	is.obs[op][i].Observe(time.Since(start).Seconds())
}

func (is *instrumentedStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	t := time.Now()
	rec, created, err := is.s.Reserve(ctx, p)
	is.observe(opReserve, t, err)
	return rec, created, err
}

func (is *instrumentedStore) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	t := time.Now()
	rec, err := is.s.Get(ctx, key)
	is.observe(opGet, t, err)
	return rec, err
}

func (is *instrumentedStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	t := time.Now()
	err := is.s.Complete(ctx, p)
	is.observe(opComplete, t, err)
	return err
}

func (is *instrumentedStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	t := time.Now()
	err := is.s.Release(ctx, p)
	is.observe(opRelease, t, err)
	return err
}

func (is *instrumentedStore) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	t := time.Now()
	err := is.s.Escalate(ctx, p)
	is.observe(opEscalate, t, err)
	return err
}

func (is *instrumentedStore) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	t := time.Now()
	err := is.s.Extend(ctx, p)
	is.observe(opExtend, t, err)
	return err
}

func (is *instrumentedStore) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	t := time.Now()
	err := is.s.Takeover(ctx, p)
	is.observe(opTakeover, t, err)
	return err
}

func (is *instrumentedStore) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	t := time.Now()
	err := is.s.Resolve(ctx, p)
	is.observe(opResolve, t, err)
	return err
}

// ReadResponse implements idemstore.ResponseReader, through the wrapped
// store's, so that the engine reads large answers apart (a store without
// it never leaves one out).
func (is *instrumentedStore) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	t := time.Now()
	resp, err := idemstore.ReadResponse(ctx, is.s, key, token)
	is.observe(opReadResponse, t, err)
	return resp, err
}

// GetHead implements idemstore.HeadReader, through the wrapped store's
// (or its Get), counted as a get.
func (is *instrumentedStore) GetHead(ctx context.Context, key idemstore.Key, inline int) (*idemstore.Record, error) {
	t := time.Now()
	rec, err := idemstore.GetHead(ctx, is.s, key, inline)
	is.observe(opGet, t, err)
	return rec, err
}

func (is *instrumentedStore) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	t := time.Now()
	err := is.s.Delete(ctx, p)
	is.observe(opDelete, t, err)
	return err
}

func (is *instrumentedStore) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	t := time.Now()
	recs, err := is.s.ListExpiredLeases(ctx, limit)
	is.observe(opListExpired, t, err)
	return recs, err
}

func (is *instrumentedStore) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	t := time.Now()
	page, err := is.s.List(ctx, p)
	is.observe(opList, t, err)
	return page, err
}

func (is *instrumentedStore) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	t := time.Now()
	n, err := is.s.Purge(ctx, p)
	is.observe(opPurge, t, err)
	return n, err
}

func (is *instrumentedStore) Capabilities() idemstore.Capabilities { return is.s.Capabilities() }

// Counts forwards to a store that counts (idemstore.Counter), for the
// admin API's counts; another store's answer wraps
// idemstore.ErrSearchUnsupported.
func (is *instrumentedStore) Counts(ctx context.Context) (idemstore.Counts, error) {
	c, ok := is.s.(idemstore.Counter)
	if !ok {
		return idemstore.Counts{}, fmt.Errorf("%w: the store does not count keys", idemstore.ErrSearchUnsupported)
	}
	return c.Counts(ctx)
}

type instrumentedNotifier struct {
	*instrumentedStore
	n idemstore.Notifier
}

func (in *instrumentedNotifier) Subscribe(ctx context.Context, key idemstore.Key) (<-chan struct{}, func(), error) {
	return in.n.Subscribe(ctx, key)
}
