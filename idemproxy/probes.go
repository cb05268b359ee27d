package idemproxy

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// withProbes adds the admin listener's liveness probe to next and makes its
// readiness probe answer for draining:
//
//   - GET /livez answers 200 while the process serves HTTP at all. It asks
//     nothing of the store, so that a store outage never gets the process
//     restarted (a liveness probe that restarts every replica at once turns
//     an outage into a longer one).
//   - GET /readyz answers 503 "draining" once draining reports true (the
//     proxy got SIGTERM and finishes its in-flight requests), before next
//     asks the store: a load balancer stops sending requests that the
//     proxy would refuse.
func withProbes(next http.Handler, draining func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/livez" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			fmt.Fprintln(w, "ok")
		case r.URL.Path == "/readyz" && (r.Method == http.MethodGet || r.Method == http.MethodHead) && draining():
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: draining")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// Draining reports whether BeginShutdown was called: the proxy refuses new
// protected requests and finishes those in flight.
func (p *Proxy) Draining() bool { return p.closing.Load() }

// watchProxy adds the gauges read from p at each scrape:
// idem_proxy_body_memory_bytes and idem_proxy_body_memory_limit_bytes, and
// idem_proxy_replay_memory_bytes and idem_proxy_replay_memory_limit_bytes.
// Call it at most once per Metrics: a second registration panics.
func (m *Metrics) watchProxy(p *Proxy) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idem_proxy_body_memory_bytes",
			Help: "Bytes of protected request bodies held in memory now (charged as they arrive), against idem_proxy_body_memory_limit_bytes (max_body_memory); a request that does not fit gets 503 busy.",
		}, func() float64 { return float64(p.bodies.Used()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idem_proxy_body_memory_limit_bytes",
			Help: "The max_body_memory setting: bytes of protected request bodies that may be held in memory at once.",
		}, func() float64 { return float64(p.bodies.Max()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idem_proxy_replay_memory_bytes",
			Help: "Bytes of stored answers held in memory now while they are read from the store and written to clients, against idem_proxy_replay_memory_limit_bytes (max_replay_memory); a replay that does not fit gets 503 busy.",
		}, func() float64 { return float64(p.replays.Used()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idem_proxy_replay_memory_limit_bytes",
			Help: "The max_replay_memory setting: bytes of stored answers that may be held in memory at once while clients read their replays.",
		}, func() float64 { return float64(p.replays.Max()) }),
	)
}

// inFlight counts the requests h serves at once in
// idem_proxy_requests_in_flight, protected or not.
func (m *Metrics) inFlight(h http.Handler) http.Handler {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idem_proxy_requests_in_flight",
		Help: "Requests the proxy listener serves now, protected or passed through, replays included.",
	})
	m.Registry.MustRegister(g)
	return promhttp.InstrumentHandlerInFlight(g, h)
}
