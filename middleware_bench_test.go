package idem_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// benchHandler is a small JSON API handler, the baseline every middleware
// figure is compared with.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"id":"pay_1","amount":1000,"currency":"usd"}`))
})

const benchBody = `{"amount":1000,"currency":"usd","customer":"cus_123"}`

// discardWriter is a light ResponseWriter, so that the benchmarks measure
// the middleware rather than httptest.ResponseRecorder. Like net/http's, it
// has a fresh header map for every request.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(s int)           { d.status = s }

func (d *discardWriter) reset() {
	d.h = make(http.Header)
	d.status = 0
}

// benchRequests builds n requests up front, so request construction is
// not measured.
func benchRequests(n int, method string, key func(i int) string) []*http.Request {
	reqs := make([]*http.Request, n)
	for i := range reqs {
		r := httptest.NewRequest(method, "/payments", nil)
		r.Header.Set("Content-Type", "application/json")
		if k := key(i); k != "" {
			r.Header.Set(idem.HeaderName, k)
		}
		reqs[i] = r
	}
	return reqs
}

func runBench(b *testing.B, h http.Handler, reqs []*http.Request) {
	w := &discardWriter{h: make(http.Header)}
	body := strings.NewReader(benchBody)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := reqs[i%len(reqs)]
		body.Reset(benchBody)
		r.Body = readCloser{body}
		r.ContentLength = int64(len(benchBody))
		w.reset()
		h.ServeHTTP(w, r)
		if w.status != http.StatusCreated {
			b.Fatalf("status %d", w.status)
		}
	}
}

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }

func benchMiddleware(b *testing.B) http.Handler {
	st := idemmem.MustNew(idemmem.Config{})
	b.Cleanup(func() { st.Close() })
	e, err := idem.NewEngine(st, idem.EngineConfig{})
	if err != nil {
		b.Fatal(err)
	}
	return idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(benchHandler)
}

// BenchmarkMiddleware compares, in one run, the bare handler with the
// handler behind the middleware on its three paths: the first request of a
// key (acquire, run, store), a replay, and an unprotected GET.
func BenchmarkMiddleware(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		runBench(b, benchHandler, benchRequests(1, http.MethodPost, func(int) string { return "k" }))
	})
	b.Run("acquire", func(b *testing.B) {
		reqs := benchRequests(b.N, http.MethodPost, func(i int) string { return "key-" + strconv.Itoa(i) })
		runBench(b, benchMiddleware(b), reqs)
	})
	b.Run("acquire-steady", func(b *testing.B) {
		// A store of constant size: 4096 keys cycle and expire (see
		// BenchmarkEngineSteadyState), instead of one new record per request.
		const ring = 4096
		var secs atomic.Int64
		secs.Store(time.Now().Unix())
		st := idemmem.MustNew(idemmem.Config{})
		b.Cleanup(func() { st.Close() })
		e, err := idem.NewEngine(st, idem.EngineConfig{Retention: ring * time.Second,
			Now: func() time.Time { return time.Unix(secs.Add(1), 0) }})
		if err != nil {
			b.Fatal(err)
		}
		h := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(benchHandler)
		runBench(b, h, benchRequests(ring, http.MethodPost, func(i int) string { return "key-" + strconv.Itoa(i) }))
	})
	b.Run("replay", func(b *testing.B) {
		h := benchMiddleware(b)
		reqs := benchRequests(1, http.MethodPost, func(int) string { return "k" })
		runBench(b, h, reqs) // the first iteration stores, the rest replay
	})
	b.Run("passthrough-get", func(b *testing.B) {
		runBench(b, benchMiddleware(b), benchRequests(1, http.MethodGet, func(int) string { return "" }))
	})
}
