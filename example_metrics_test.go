package idem_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// Config.OnOutcome feeds metrics: here a Prometheus counter of protected
// requests by outcome and settlement, and a histogram of their duration.
// (idem serve exports the same counter as idem_proxy_requests_total.)
func ExampleMiddleware_metrics() {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_idempotency_requests_total",
		Help: "Protected requests by idempotency outcome and settlement.",
	}, []string{"outcome", "settlement"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "payments_idempotency_duration_seconds",
		Help: "Time spent in the idempotency middleware and the handler.",
	}, []string{"outcome"})
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(requests, duration)

	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	protect := idem.Middleware(engine, idem.Config{
		Scope: idem.GlobalScope,
		OnOutcome: func(ev idem.Event) {
			requests.WithLabelValues(ev.Outcome, ev.Settlement).Inc()
			duration.WithLabelValues(ev.Outcome).Observe(ev.Duration.Seconds())
		},
	})
	srv := httptest.NewServer(protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	for _, key := range []string{"k-1", "k-1", "k-2", ""} {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	fmt.Println("acquired and completed:", testutil.ToFloat64(requests.WithLabelValues("acquired", "completed")))
	fmt.Println("replayed:", testutil.ToFloat64(requests.WithLabelValues("replayed", "")))
	fmt.Println("missing key:", testutil.ToFloat64(requests.WithLabelValues("missing_key", "")))
	// Output:
	// acquired and completed: 2
	// replayed: 1
	// missing key: 1
}
