package main_test

// Adopting idem on a live API: observe mode, reload on SIGHUP, CORS for
// idem's own answers, tracing.

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
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
