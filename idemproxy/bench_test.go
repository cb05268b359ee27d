package idemproxy_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// BenchmarkProxy measures one protected POST with a fresh key through the
// idempotency proxy on the memory store (metrics on, as idem serve runs),
// against the same request through a stock httputil.ReverseProxy, both
// called in process in front of one loopback upstream. The difference is
// idem's own cost per request: time, bytes and allocations.
func BenchmarkProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1","amount":1000,"currency":"usd","status":"succeeded"}`)
	}))
	b.Cleanup(up.Close)
	target, err := url.Parse(up.URL)
	if err != nil {
		b.Fatal(err)
	}
	stock := httputil.NewSingleHostReverseProxy(target)
	stock.Transport = idemproxy.NewTransport(0)

	mem := idemmem.MustNew(idemmem.Config{})
	b.Cleanup(func() { mem.Close() })
	engine, err := idem.NewEngine(mem, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := idemproxy.ParseConfig(fmt.Appendf(nil, "upstream: %s\nscope_header: Authorization\n", up.URL))
	if err != nil {
		b.Fatal(err)
	}
	proxy, err := idemproxy.New(engine, cfg, idemproxy.Options{Logger: slog.New(slog.DiscardHandler), Metrics: idemproxy.NewMetrics()})
	if err != nil {
		b.Fatal(err)
	}

	body := []byte(`{"amount":1000,"currency":"usd"}`)
	var seq atomic.Int64
	for _, tc := range []struct {
		name string
		h    http.Handler
	}{{"stock", stock}, {"idem", proxy}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer bench")
					req.Header.Set("Idempotency-Key", "k-"+strconv.FormatInt(seq.Add(1), 10))
					rec := httptest.NewRecorder()
					tc.h.ServeHTTP(rec, req)
					if rec.Code != http.StatusCreated {
						b.Fatalf("%s answered %d: %s", tc.name, rec.Code, rec.Body)
					}
				}
			})
		})
	}
}
