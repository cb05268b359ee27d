package deploytest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// dashboardQueries returns every PromQL expression of the dashboard, with
// Grafana's variables replaced by values PromQL accepts.
func dashboardQueries(t *testing.T) (exprs []string, variableQueries []string) {
	t.Helper()
	b, err := os.ReadFile(deployPath("grafana", "idem.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana/idem.json: %v", err)
	}
	grafana := strings.NewReplacer("$__rate_interval", "5m", "$job", "idem")
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q: a target with no expression", p.Title)
			}
			exprs = append(exprs, grafana.Replace(tg.Expr))
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			variableQueries = append(variableQueries, v.Definition)
		}
	}
	return exprs, variableQueries
}

// metricNames parses expr and returns the metric names it selects.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v", expr, err)
		return nil
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			t.Errorf("%s: a selector with no metric name", expr)
		}
		names = append(names, name)
		return nil
	})
	return names
}

// TestDashboardQueries: every expression of the Grafana dashboard parses
// as PromQL and names only metrics that a live idem serve exports on its
// admin listener's /metrics, after a few requests.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	exprs, vars := dashboardQueries(t)
	if len(exprs) < 10 {
		t.Fatalf("%d expressions in the dashboard", len(exprs))
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricNames(t, e) {
			used[n] = true
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),`)
	for _, v := range vars {
		m := labelValues.FindStringSubmatch(v)
		if m == nil {
			t.Errorf("variable query %q: not label_values(metric, label)", v)
			continue
		}
		used[m[1]] = true
	}
	exported := scrapeLiveProxy(t)
	var missing []string
	for n := range used {
		if !exported[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the dashboard uses metrics /metrics does not export: %v", missing)
	}
	// What the brief of the dashboard promises, by metric.
	for _, n := range []string{
		"idem_proxy_requests_total", "idem_review_keys", "idem_review_oldest_age_seconds",
		"idem_store_duration_seconds_bucket", "idem_store_duration_seconds_count",
		"idem_upstream_duration_seconds_count", "idem_proxy_body_memory_bytes",
		"idem_proxy_body_memory_limit_bytes", "idem_proxy_requests_in_flight",
	} {
		if !used[n] {
			t.Errorf("no panel shows %s", n)
		}
	}
}

// startProxy runs idem serve's Server on loopback in front of upstream,
// on a memory store, until the test ends; it returns the proxy's and the
// admin listener's addresses.
func startProxy(t *testing.T, upstream string, yaml string) (proxy, admin string) {
	t.Helper()
	cfg, err := idemproxy.ParseConfig([]byte("upstream: " + upstream + "\nlisten: 127.0.0.1:0\nadmin: 127.0.0.1:0\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	store := idemmem.MustNew(idemmem.Config{})
	ready := make(chan [2]net.Addr, 1)
	srv := &idemproxy.Server{Config: cfg, Store: store, Logger: slog.New(slog.DiscardHandler),
		Ready: func(p, a net.Addr) { ready <- [2]net.Addr{p, a} }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		store.Close()
	})
	select {
	case a := <-ready:
		return a[0].String(), a[1].String()
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("idem serve did not start in a minute")
	}
	return "", ""
}

// scrapeLiveProxy starts a proxy, sends a protected POST twice (the second
// replays), a GET, and a request to a route in observe mode, then returns
// the names of the samples its /metrics exports.
func scrapeLiveProxy(t *testing.T) map[string]bool {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_1"}`)
	}))
	defer up.Close()
	proxy, admin := startProxy(t, up.URL, "anonymous: shared\nroutes:\n  - match: POST /observed\n    mode: observe\n")
	send := func(method, path, key string) *http.Response {
		req, _ := http.NewRequest(method, "http://"+proxy+path, strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	send("POST", "/payments", "k1")
	if r := send("POST", "/payments", "k1"); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry was not replayed: %v", r.Header)
	}
	send("GET", "/payments", "")
	send("POST", "/observed", "")

	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// TestMetricNames: every metric idem exports follows Prometheus's and
// OpenTelemetry's conventions: idem_ names in snake case, counters end in
// _total, and a histogram of durations is in seconds.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	_, admin := startProxy(t, up.URL, "")
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	snake := regexp.MustCompile(`^idem(_[a-z0-9]+)+$`)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" || !strings.HasPrefix(f[2], "idem_") {
			continue
		}
		name, kind := f[2], f[3]
		n++
		if !snake.MatchString(name) {
			t.Errorf("%s: not snake case", name)
		}
		switch kind {
		case "counter":
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s does not end in _total", name)
			}
		case "histogram":
			if !strings.HasSuffix(name, "_seconds") && !strings.HasSuffix(name, "_bytes") {
				t.Errorf("histogram %s names no unit", name)
			}
		case "gauge":
			if strings.HasSuffix(name, "_total") {
				t.Errorf("gauge %s ends in _total", name)
			}
		}
	}
	if n < 8 {
		t.Errorf("only %d idem_ metrics on /metrics", n)
	}
}
