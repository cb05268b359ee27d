package main_test

// Adopting idem on a live API: observe mode, reload on SIGHUP, CORS for
// idem's own answers, tracing.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// metric returns the value of the sample of name whose labels include all
// of labels ("route=\"default\""), or -1. A sample without labels matches
// when labels is empty.
func metric(t *testing.T, p *proxy, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^` + name + `(?:\{([^}]*)\})? (\S+)$`)
next:
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		for _, l := range labels {
			if !strings.Contains(m[1], l) {
				continue next
			}
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		return v
	}
	return -1
}

// TestObserveMode: in observe mode a keyless POST and a same-key retry both
// reach the upstream, and /metrics counts one missing_key and one
// would_replay; the answers are the upstream's own.
func TestObserveMode(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--mode", "observe", "--admin", "127.0.0.1:0")
	base := "http://" + p.addr
	want(t, "route's findings before any", metric(t, p, "idem_observe_findings_total", `route="default"`, `finding="would_replay"`), 0.0)

	a := do(t, "POST", base+"/pay", "", `{"amount":1}`)
	want(t, "keyless status", a.status, 201)
	first := do(t, "POST", base+"/pay", "k1", `{"amount":1}`)
	retry := do(t, "POST", base+"/pay", "k1", `{"amount":1}`)
	want(t, "retry body (run again)", retry.body, `{"method":"POST","run":3}`)
	want(t, "upstream runs", up.runs("/pay"), 3)
	for _, x := range []answer{a, first, retry} {
		for _, h := range []string{"Idempotency-Outcome", "Idempotent-Replayed"} {
			if v := x.header.Get(h); v != "" {
				t.Errorf("observe mode added %s: %s", h, v)
			}
		}
	}
	other := do(t, "POST", base+"/pay", "k1", `{"amount":2}`)
	want(t, "conflicting retry forwarded", other.status, 201)

	want(t, "missing_key", metric(t, p, "idem_observe_findings_total", `route="default"`, `finding="missing_key"`), 1.0)
	want(t, "would_replay", metric(t, p, "idem_observe_findings_total", `route="default"`, `finding="would_replay"`), 1.0)
	want(t, "would_conflict", metric(t, p, "idem_observe_findings_total", `route="default"`, `finding="would_conflict"`), 1.0)
	want(t, "acquired", metric(t, p, "idem_proxy_requests_total", `outcome="acquired"`), 1.0)
	for _, f := range []string{"missing_key", "would_replay", "would_conflict"} {
		if !strings.Contains(p.log(), fmt.Sprintf(`route=default finding=%s`, f)) {
			t.Errorf("no log line for %s:\n%s", f, p.log())
		}
	}
}

// TestSIGHUPReloads: switching one route from observe to enforce by SIGHUP
// takes effect without a restart and without failing a request in flight;
// a file with an error is refused and the running routes kept; a setting
// only a restart applies is named.
func TestSIGHUPReloads(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	store := sqliteStore(t)
	conf := func(mode string) string {
		return fmt.Sprintf("upstream: %s\nstore: %s\nanonymous: shared\nroutes:\n  - match: POST /pay\n    mode: %s\n  - match: POST /slow\n", up.URL, store, mode)
	}
	path := writeConfig(t, conf("observe"))
	p := startProxyAs(t, "--config", path, "--listen", "127.0.0.1:0")
	base := "http://" + p.addr
	want(t, "observed keyless POST", do(t, "POST", base+"/pay", "", `{}`).status, 201)

	inFlight := make(chan answer)
	go func() { inFlight <- do(t, "POST", base+"/slow?sleep=1s", "slow-1", `{}`) }()
	waitRuns(t, up, "/slow", 1)
	reloads := strings.Count(p.log(), "configuration reloaded")
	hup := func() {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(path, []byte(conf("enforce")), 0o600)
	hup()
	eventually(t, "the reload", func() bool { return strings.Count(p.log(), "configuration reloaded") > reloads })
	want(t, "enforced keyless POST", do(t, "POST", base+"/pay", "", `{}`).status, 400)
	a := <-inFlight
	want(t, "request in flight during the reload", a.status, 201)
	want(t, "its replay", do(t, "POST", base+"/slow?sleep=1s", "slow-1", `{}`).header.Get("Idempotent-Replayed"), "true")

	os.WriteFile(path, []byte(conf("enforce")+"retension: 1h\n"), 0o600)
	hup()
	eventually(t, "the refusal", func() bool { return strings.Contains(p.log(), "the configuration was not reloaded") })
	if !strings.Contains(p.log(), `did you mean retention?`) {
		t.Errorf("the refusal does not say why:\n%s", p.log())
	}
	want(t, "still enforced", do(t, "POST", base+"/pay", "", `{}`).status, 400)

	os.WriteFile(path, []byte(conf("observe")+"purge_batch: 7\n"), 0o600)
	hup()
	eventually(t, "the restart warning", func() bool { return strings.Contains(p.log(), "need a restart") })
	if !strings.Contains(p.log(), "settings=purge_batch") {
		t.Errorf("the warning does not name purge_batch:\n%s", p.log())
	}
	want(t, "observed again", do(t, "POST", base+"/pay", "", `{}`).status, 201)
	select {
	case err := <-p.exited:
		t.Fatalf("idem serve exited after SIGHUP: %v", err)
	default:
	}
}

// TestCORSAndProblemBase: with --cors-origin, a preflight (answered by the
// upstream) and a 409 from idem carry the exposed headers; with
// --problem-base-url, problem types point at the operator's docs; and
// keep_headers/drop_headers and include_fields apply from the file.
func TestCORSAndProblemBase(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	cfg := writeConfig(t, fmt.Sprintf(`upstream: %s
store: %s
anonymous: shared
routes:
  - match: POST /orders
    include_fields: [/amount]
    drop_headers: [X-Got-Key]
`, up.URL, sqliteStore(t)))
	p := startProxyAs(t, "--config", cfg, "--cors-origin", "https://app.example.com", "--problem-base-url", "https://api.example.com/problems#")
	base := "http://" + p.addr
	const origin = "https://app.example.com"

	req, _ := http.NewRequest(http.MethodOptions, base+"/pay", nil)
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want(t, "preflight reached the upstream", up.runs("/pay"), 1)
	want(t, "preflight exposes", resp.Header.Get("Access-Control-Expose-Headers"), "Idempotent-Replayed, Idempotency-Outcome, Retry-After")

	inFlight := make(chan answer)
	go func() { inFlight <- do(t, "POST", base+"/slow?hold=1", "k", `{}`, "Origin", origin) }()
	waitRuns(t, up, "/slow", 1)
	a := do(t, "POST", base+"/slow?hold=1", "k", `{}`, "Origin", origin)
	up.release() // only now may the first answer
	<-inFlight
	want(t, "status", a.status, 409)
	want(t, "Access-Control-Allow-Origin", a.header.Get("Access-Control-Allow-Origin"), origin)
	want(t, "Access-Control-Expose-Headers", a.header.Get("Access-Control-Expose-Headers"), "Idempotent-Replayed, Idempotency-Outcome, Retry-After")
	var pd struct{ Type string }
	json.Unmarshal([]byte(a.body), &pd)
	want(t, "problem type", pd.Type, "https://api.example.com/problems#in-flight")

	first := do(t, "POST", base+"/orders", "o1", `{"amount":5,"ts":1}`)
	again := do(t, "POST", base+"/orders", "o1", `{"ts":2,"amount":5}`)
	want(t, "replay with only an unincluded field changed", again.header.Get("Idempotent-Replayed"), "true")
	want(t, "first X-Got-Key", first.header.Get("X-Got-Key"), "o1")
	want(t, "replayed X-Got-Key (dropped)", again.header.Get("X-Got-Key"), "")
	want(t, "orders runs", up.runs("/orders"), 1)
}

// TestOTLPExport: the OTEL_* environment switches span export on; the
// spans of a protected request reach the OTLP endpoint (flushed at
// shutdown at the latest), with the outcome.
func TestOTLPExport(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies bytes.Buffer
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		if r.URL.Path == "/v1/traces" {
			bodies.Write(b)
		}
		mu.Unlock()
	}))
	t.Cleanup(collector.Close)
	up := newUpstream(t)
	p := startProxyEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL, "OTEL_SERVICE_NAME=idem-e2e"},
		"--upstream", up.URL, "--store", sqliteStore(t), "--anonymous", "shared")
	if !strings.Contains(p.log(), "tracing: spans exported over OTLP") {
		t.Errorf("no tracing line at startup:\n%s", p.log())
	}
	want(t, "status", do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`).status, 201)
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	mu.Lock()
	defer mu.Unlock()
	for _, w := range []string{"idem.request", "idem.store.reserve", "idem.upstream", "acquired", "idem-e2e"} {
		if !bytes.Contains(bodies.Bytes(), []byte(w)) {
			t.Errorf("the exported spans lack %q", w)
		}
	}
}

// TestNoTracingWithoutEnv: without OTEL_* variables nothing is exported and
// nothing said.
func TestNoTracingWithoutEnv(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxyEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_TRACES_EXPORTER="}, "--upstream", up.URL, "--store", sqliteStore(t), "--anonymous", "shared")
	want(t, "status", do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`).status, 201)
	if strings.Contains(p.log(), "tracing") {
		t.Errorf("tracing without OTEL_* variables:\n%s", p.log())
	}
}
