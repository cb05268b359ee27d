package main_test

// Adopting idem on a live API: observe mode, reload on SIGHUP, CORS for
// idem's own answers, tracing.

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// metric returns the value of the sample of name whose labels include all
// of labels ("route=\"default\""), or -1.
func metric(t *testing.T, p *proxy, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^` + name + `\{([^}]*)\} (\S+)$`)
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
