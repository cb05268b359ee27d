package main_test

// End-to-end tests of settling keys in review: the admin API, the admin
// commands, the resolver, the review webhook and the review gauges,
// against the built binary.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

const adminToken = "e2e-admin-token-0123456789abcdef"

// tokenFile writes an admin token file naming the token ops.
func tokenFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(path, []byte("# e2e\nops:"+adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// adminCall sends one admin API request; token "" sends none.
func adminCall(t *testing.T, p *proxy, method, path, token, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+p.admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// reviewList lists the keys in review through the admin API.
func reviewList(t *testing.T, p *proxy) []idemadmin.Item {
	t.Helper()
	a := adminCall(t, p, "GET", "/api/v1/keys?state=needs_review", adminToken, "")
	if a.status != 200 {
		t.Fatalf("GET /api/v1/keys?state=needs_review: %d %s", a.status, a.body)
	}
	var page idemadmin.Page
	if err := json.Unmarshal([]byte(a.body), &page); err != nil {
		t.Fatal(err)
	}
	return page.Items
}

// eventually polls cond, bounded, for what the binary does on its own
// time (its logs, its background loops).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 30s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAdminAPISettlesReview: a reset upstream puts keys in review; the
// admin API lists them with the token and refuses without it; release
// makes the retry run once, complete makes it replay the given answer.
func TestAdminAPISettlesReview(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--admin", "127.0.0.1:0",
		"--admin-token-file", tokenFile(t), "--store-request")
	base := "http://" + p.addr
	for _, k := range []string{"lost", "charged"} {
		want(t, "status of "+k, do(t, "POST", base+"/reset?currency=eur", k, `{"amount":7}`).status, 502)
	}
	want(t, "upstream runs", up.runs("/reset"), 2)

	// Without the token, or with a wrong one: 401, and nothing listed.
	for _, tok := range []string{"", adminToken + "x"} {
		a := adminCall(t, p, "GET", "/api/v1/keys?state=needs_review", tok, "")
		want(t, "status without the token", a.status, 401)
		if strings.Contains(a.body, "lost") {
			t.Errorf("a 401 shows a key: %s", a.body)
		}
	}
	// Without a token the page is not served either; health is.
	want(t, "/healthz", adminCall(t, p, "GET", "/healthz", "", "").status, 200)

	items := reviewList(t, p)
	if len(items) != 2 {
		t.Fatalf("%d keys in review, want 2: %+v", len(items), items)
	}
	ids, attempts := map[string]string{}, map[string]string{}
	for _, it := range items {
		ids[it.Key], attempts[it.Key] = it.ID, it.Attempt
		if it.Operation != opName("POST", "/reset") || it.Request == nil || it.Request.Query != "currency=eur" || !strings.Contains(it.Reason, "upstream") {
			t.Errorf("item %+v", it)
		}
	}
	var it idemadmin.Item
	json.Unmarshal([]byte(adminCall(t, p, "GET", "/api/v1/keys/"+ids["charged"], adminToken, "").body), &it)
	if it.Request == nil || it.Request.Body == nil || *it.Request.Body != `{"amount":7}` {
		t.Fatalf("the detail lacks the stored request body: %+v", it.Request)
	}

	// release: the retry is forwarded once more (and fails again on /reset).
	a := adminCall(t, p, "POST", "/api/v1/keys/"+ids["lost"]+"/resolve", adminToken, `{"action":"release","note":"never reached the provider","attempt":"`+attempts["lost"]+`"}`)
	want(t, "release", a.status, 200)
	want(t, "released retry", do(t, "POST", base+"/reset?currency=eur", "lost", `{"amount":7}`).status, 502)
	want(t, "upstream runs after the release", up.runs("/reset"), 3)

	// complete: the retry replays the given answer and runs nothing.
	a = adminCall(t, p, "POST", "/api/v1/keys/"+ids["charged"]+"/resolve", adminToken,
		`{"action":"complete","status":201,"headers":{"Content-Type":"application/json"},"body":"{\"charge\":\"ch_1\"}","note":"charged","attempt":"`+attempts["charged"]+`"}`)
	want(t, "complete", a.status, 200)
	r := do(t, "POST", base+"/reset?currency=eur", "charged", `{"amount":7}`)
	want(t, "completed retry status", r.status, 201)
	want(t, "completed retry body", r.body, `{"charge":"ch_1"}`)
	want(t, "Idempotent-Replayed", r.header.Get("Idempotent-Replayed"), "true")
	want(t, "upstream runs after complete", up.runs("/reset"), 3)

	// Resolving it again is a conflict that names the key.
	a = adminCall(t, p, "POST", "/api/v1/keys/"+ids["charged"]+"/resolve", adminToken, `{"action":"release","attempt":"*"}`)
	want(t, "second resolve", a.status, 409)
	if !strings.Contains(a.body, `\"charged\"`) {
		t.Errorf("the conflict does not name the key: %s", a.body)
	}

	// The log has a warn line per key that went to review, with the key,
	// and the audit lines of both changes with who and why.
	eventually(t, "the audit lines", func() bool { return strings.Contains(p.log(), `note=charged`) })
	log := p.log()
	for _, s := range []string{`level=WARN msg="idem: key needs review"`, `key=lost`, `key=charged`, `msg="admin: key resolved" by=ops action=release`, `note="never reached the provider"`} {
		if !strings.Contains(log, s) {
			t.Errorf("the proxy log lacks %s:\n%s", s, grepLines(log, "review"))
		}
	}
	// One warn line each time a key went to review, not two: "lost" went
	// twice, before its release and after the retry failed again.
	if n := strings.Count(log, "key needs review"); n != 3 {
		t.Errorf("%d review lines for 3 times a key went to review:\n%s", n, grepLines(log, "review"))
	}
}

// TestAdminWithoutToken: without a token the admin listener serves only
// health and metrics.
func TestAdminWithoutToken(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", "memory://", "--admin", "127.0.0.1:0")
	for path, status := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/api/v1/keys": 404, "/": 404, "/login": 404} {
		want(t, "GET "+path, adminCall(t, p, "GET", path, adminToken, "").status, status)
	}
	out, err := exec.Command(binary, "serve", "--upstream", up.URL, "--store", "memory://", "--admin-token-file", tokenFile(t)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "needs the admin listener") {
		t.Errorf("a token file without --admin: %v\n%s", err, out)
	}
}

// TestReviewCommands settles keys with idem review and idem keys, through
// the admin API of a proxy on a memory store (which only the proxy can
// see) and directly on a SQLite store.
func TestReviewCommands(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	tf := tokenFile(t)
	p := startProxy(t, "--upstream", up.URL, "--store", "memory://", "--admin", "127.0.0.1:0", "--admin-token-file", tf)
	base := "http://" + p.addr
	for _, k := range []string{"lost", "charged"} {
		want(t, "status of "+k, do(t, "POST", base+"/reset", k, `{}`).status, 502)
	}
	admin := []string{"--admin-url", "http://" + p.admin, "--admin-token-file", tf}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(binary, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("idem %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := run(append([]string{"review", "list"}, admin...)...)
	for _, s := range []string{"ID", "REQUEST", "lost~", "charged~", "POST /reset", "upstream"} {
		if !strings.Contains(out, s) {
			t.Errorf("review list lacks %q:\n%s", s, out)
		}
	}
	var items []idemadmin.Item
	if err := json.Unmarshal([]byte(run(append([]string{"review", "list", "--json"}, admin...)...)), &items); err != nil || len(items) != 2 {
		t.Fatalf("review list --json: %v, %d items", err, len(items))
	}
	id := map[string]string{items[0].Key: items[0].ID, items[1].Key: items[1].ID}
	attempt := map[string]string{items[0].Key: items[0].Attempt, items[1].Key: items[1].Attempt}

	out = run(append([]string{"review", "resolve", id["lost"], "--release", "--note", "not charged", "--attempt", attempt["lost"]}, admin...)...)
	if !strings.Contains(out, `Released key "lost"`) {
		t.Errorf("resolve --release: %s", out)
	}
	run(append([]string{"review", "resolve", "--scope", items[0].Scope, "--operation", opName("POST", "/reset"), "--key", "charged", "--attempt", attempt["charged"],
		"--status", "201", "--header", "Content-Type: application/json", "--body", `{"charge":"ch_1"}`}, admin...)...)
	want(t, "released retry", do(t, "POST", base+"/reset", "lost", `{}`).status, 502)
	a := do(t, "POST", base+"/reset", "charged", `{}`)
	want(t, "completed retry", a.body, `{"charge":"ch_1"}`)
	want(t, "upstream runs", up.runs("/reset"), 3)

	// keys get, list and delete.
	out = run(append([]string{"keys", "get", id["charged"]}, admin...)...)
	for _, s := range []string{"state", "completed", "stored answer: 201", `{"charge":"ch_1"}`, "Content-Type: application/json"} {
		if !strings.Contains(out, s) {
			t.Errorf("keys get lacks %q:\n%s", s, out)
		}
	}
	if out = run(append([]string{"keys", "list", "--state", "completed"}, admin...)...); !strings.Contains(out, "charged") {
		t.Errorf("keys list --state completed:\n%s", out)
	}
	run(append([]string{"keys", "delete", id["charged"], "--note", "charge again", "--attempt", attempt["charged"]}, admin...)...)
	want(t, "a request after delete", do(t, "POST", base+"/reset", "charged", `{}`).status, 502)
	want(t, "upstream runs", up.runs("/reset"), 4)

	// Errors name the key, and exit 1; usage errors exit 2.
	nosuch := idemadmin.KeyID(idemstore.Key{Scope: items[0].Scope, Operation: opName("POST", "/reset"), Key: "nosuch"})
	out2, err := exec.Command(binary, append([]string{"review", "resolve", nosuch, "--release"}, admin...)...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out2), `no key "nosuch" (`+opName("POST", "/reset")+`, scope anonymous)`) || strings.Count(string(out2), "idem:") != 1 {
		t.Errorf("resolving a key that does not exist: %v\n%s", err, out2)
	}
	noEnv := append(os.Environ(), "IDEM_ADMIN_TOKEN=", "IDEM_ADMIN_URL=")
	for _, args := range [][]string{
		append([]string{"review", "resolve", id["lost"]}, admin...),  // neither --release nor --status
		append([]string{"review", "resolve", "--release"}, admin...), // no key
		append([]string{"keys", "get", "!!"}, admin...),              // a malformed id
		{"review", "list"}, // no --admin-url nor --store
		{"review", "list", "--admin-url", "http://" + p.admin},                   // no token
		append([]string{"review", "list", "--store", "sqlite://x.db"}, admin...), // both
		{"keys", "list", "--state", "done", "--store", "sqlite://x.db"},          // a bad state
	} {
		cmd := exec.Command(binary, args...)
		cmd.Env = noEnv
		if out, err := cmd.CombinedOutput(); err == nil || err.(*exec.ExitError).ExitCode() != 2 {
			t.Errorf("idem %v: %v, want exit 2\n%s", args, err, out)
		}
	}

	// The token and URL from the environment work as the flags do.
	cmd := exec.Command(binary, "review", "list")
	cmd.Env = append(os.Environ(), "IDEM_ADMIN_TOKEN="+adminToken, "IDEM_ADMIN_URL=http://"+p.admin)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "lost") {
		t.Errorf("review list with IDEM_ADMIN_TOKEN and IDEM_ADMIN_URL: %v\n%s", err, out)
	}
}

// TestReviewCommandsNeverCreateAStore: --store on a SQLite file that does
// not exist, or on memory://, is an error, and creates nothing.
func TestReviewCommandsNeverCreateAStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"review", "list", "--store", "sqlite://idem.db"},
		{"keys", "list", "--store", "sqlite://idem.db"},
		{"review", "resolve", "--store", "sqlite://idem.db", "--scope", "s", "--operation", "POST /x", "--key", "k", "--release"},
		{"keys", "delete", "--store", "sqlite://idem.db", "--scope", "s", "--operation", "POST /x", "--key", "k"},
		{"review", "list", "--store", "memory://"},
	} {
		cmd := exec.Command(binary, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "does not exist") && !strings.Contains(string(out), "memory://") {
			t.Errorf("idem %v: %v\n%s", args, err, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the commands created %v", entries)
	}
}

// TestReviewCommandsOnStore settles a key directly on the proxy's SQLite
// file, with an error that names the key when it is not in review.
func TestReviewCommandsOnStore(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	store := sqliteStore(t)
	p := startProxy(t, "--upstream", up.URL, "--store", store)
	want(t, "reset", do(t, "POST", "http://"+p.addr+"/reset", "k\\1", `{}`).status, 502)
	out, err := exec.Command(binary, "keys", "list", "--store", store, "--state", "needs_review", "--json").CombinedOutput()
	var items []idemadmin.Item
	if err != nil || json.Unmarshal(out, &items) != nil || len(items) != 1 {
		t.Fatalf("keys list --store: %v\n%s", err, out)
	}
	out, err = exec.Command(binary, "review", "list", "--store", store).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `k\\1`) {
		t.Errorf("review list does not show the key escaped: %v\n%s", err, out)
	}
	out, err = exec.Command(binary, "review", "resolve", items[0].ID, "--store", store, "--release", "--note", "from the shell", "--attempt", items[0].Attempt).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Released") || !strings.Contains(string(out), "by=cli:") {
		t.Fatalf("resolve --store: %v\n%s", err, out)
	}
	out, err = exec.Command(binary, "review", "resolve", items[0].ID, "--store", store, "--release").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `no key "k\\1"`) {
		t.Errorf("resolving a released key: %v\n%s", err, out)
	}

	// A path with a terminal escape prints as an escape, not as one.
	want(t, "an escape in the path", do(t, "POST", "http://"+p.addr+"/pay%1b%5b2J%e2%80%ae?q=%1b", "esc", `{}`).status, 201)
	for _, args := range [][]string{
		{"keys", "list", "--store", store, "--state", "completed"},
		// The operation is the path normalised (RFC 3986: escapes of
		// reserved and other characters kept, their hex digits upper-cased).
		{"keys", "get", "--store", store, "--scope", "anonymous", "--operation", opName("POST", "/pay%1B%5B2J%E2%80%AE"), "--key", "esc"},
	} {
		out, err := exec.Command(binary, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), `POST /pay\x1b[2J\u202e`) || strings.ContainsAny(string(out), "\x1b\u202e") {
			t.Errorf("idem %q: %v\n%q", args, err, out)
		}
	}
}

// resolverDouble answers the proxy's resolver questions by key.
type resolverDouble struct {
	*httptest.Server
	mu        sync.Mutex
	asked     map[string]int
	questions []string // the keys asked about, in order
}

func newResolverDouble(t *testing.T, answers map[string]string) *resolverDouble {
	d := &resolverDouble{asked: map[string]int{}}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q struct{ Scope, Operation, Key, Method, Path string }
		if err := json.NewDecoder(r.Body).Decode(&q); err != nil || r.Method != "POST" || q.Method != "POST" || q.Path != "/hold" || q.Scope == "" {
			t.Errorf("the resolver was asked %s %+v (%v)", r.Method, q, err)
		}
		if r.Header.Get("Idempotency-Key") != q.Key {
			t.Errorf("the resolver's Idempotency-Key %q, key %q", r.Header.Get("Idempotency-Key"), q.Key)
		}
		d.mu.Lock()
		d.asked[q.Key]++
		d.questions = append(d.questions, q.Key)
		d.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answers[q.Key])
	}))
	t.Cleanup(d.Close)
	return d
}

func (d *resolverDouble) times(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[key]
}

// answeredBefore reports whether every one of keys was asked about, and
// another question came after the last about each. The proxy asks one
// question at a time and acts on each answer before it asks the next, so
// the answers about keys have then been acted on (a question counted by
// the double is not yet an answer the proxy has acted on).
func (d *resolverDouble) answeredBefore(keys ...string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	last := map[string]int{}
	for i, k := range d.questions {
		last[k] = i
	}
	for _, k := range keys {
		if i, ok := last[k]; !ok || i == len(d.questions)-1 {
			return false
		}
	}
	return true
}

// TestResolverSettlesExpiredKeys: a proxy dies while three upstream calls
// run; the next proxy on the same store finds their leases expired and
// asks the resolver, which settles one as completed, releases one, and
// leaves one to a person.
func TestResolverSettlesExpiredKeys(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	var held sync.WaitGroup
	held.Add(3)
	var runs sync.Map
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("Idempotency-Key")
		n, _ := runs.LoadOrStore(k, new(int))
		*n.(*int)++
		select {
		case <-hold:
		default:
			held.Done()
			<-hold
		}
		w.WriteHeader(201)
		fmt.Fprintf(w, "ran %s", k)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	})
	store := sqliteStore(t)
	first := startProxy(t, "--upstream", up.URL, "--store", store, "--lease", "1s")
	for _, k := range []string{"charged", "never", "unsure"} {
		go func() {
			req, _ := http.NewRequest("POST", "http://"+first.addr+"/hold", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", k)
			req.Header.Set("Content-Type", "application/json") // as do sends it: the same request
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	held.Wait()
	first.cmd.Process.Kill()
	<-first.exited
	close(hold)

	res := newResolverDouble(t, map[string]string{
		"charged": `{"outcome":"completed","status":201,"headers":{"Content-Type":"text/plain","Set-Cookie":"dropped=1"},"body":"charged by the provider"}`,
		"never":   `{"outcome":"not_found"}`,
		"unsure":  `{"outcome":"unknown"}`,
	})
	cfg := writeConfig(t, fmt.Sprintf("upstream: %s\nstore: %s\nadmin: 127.0.0.1:0\nrecover_interval: 100ms\nlease: 1s\nroutes:\n  - match: POST /hold\n    resolver_url: %s\n", up.URL, store, res.URL))
	second := startProxy(t, "--config", cfg)
	eventually(t, "the resolver asked about every key, and its answers applied", func() bool {
		return res.answeredBefore("charged", "never") && res.times("unsure") > 1
	})
	base := "http://" + second.addr
	a := do(t, "POST", base+"/hold", "charged", `{}`)
	want(t, "completed by the resolver: status", a.status, 201)
	want(t, "completed by the resolver: body", a.body, "charged by the provider")
	want(t, "no cookie from the resolver", a.header.Get("Set-Cookie"), "")
	a = do(t, "POST", base+"/hold", "never", `{}`)
	want(t, "released by the resolver: forwarded again", a.body, "ran never")
	a = do(t, "POST", base+"/hold", "unsure", `{}`)
	want(t, "left for a person", a.status, 409)
	want(t, "left for a person: problem", a.problemType(), "needs-review")
	for k, n := range map[string]int{"charged": 1, "never": 2, "unsure": 1} {
		v, _ := runs.Load(k)
		want(t, "upstream runs of "+k, *v.(*int), n)
	}
	m := do(t, "GET", "http://"+second.admin+"/metrics", "", "").body
	for _, s := range []string{`idem_resolver_calls_total{outcome="completed"} 1`, `idem_resolver_calls_total{outcome="not_found"} 1`, `idem_resolver_calls_total{outcome="unknown"}`} {
		if !strings.Contains(m, s) {
			t.Errorf("metrics lack %s:\n%s", s, grepLines(m, "idem_resolver"))
		}
	}
	eventually(t, "the review gauge", func() bool {
		return strings.Contains(do(t, "GET", "http://"+second.admin+"/metrics", "", "").body, "idem_review_keys 1\n")
	})
}

// TestReviewWebhookAndGauges: a key that goes to review is POSTed to the
// webhook and counted by the gauges.
func TestReviewWebhookAndGauges(t *testing.T) {
	t.Parallel()
	events := make(chan map[string]any, 10)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev map[string]any
		json.NewDecoder(r.Body).Decode(&ev)
		events <- ev
	}))
	t.Cleanup(hook.Close)
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--admin", "127.0.0.1:0", "--review-webhook", hook.URL)
	want(t, "reset", do(t, "POST", "http://"+p.addr+"/reset", "wh-1", `{}`).status, 502)
	var ev map[string]any
	select {
	case ev = <-events:
	case <-time.After(30 * time.Second):
		t.Fatal("the webhook got nothing")
	}
	for name, v := range map[string]string{"key": "wh-1", "operation": opName("POST", "/reset"), "method": "POST", "path": "/reset", "scope": "anonymous"} {
		if ev[name] != v {
			t.Errorf("webhook %s = %v, want %v (%v)", name, ev[name], v, ev)
		}
	}
	if r, _ := ev["reason"].(string); !strings.Contains(r, "upstream") || ev["at"] == nil || ev["id"] != idemadmin.KeyID(idemstore.Key{Scope: "anonymous", Operation: opName("POST", "/reset"), Key: "wh-1"}) {
		t.Errorf("webhook event %v", ev)
	}
	eventually(t, "the review gauges", func() bool {
		m := do(t, "GET", "http://"+p.admin+"/metrics", "", "").body
		return strings.Contains(m, "idem_review_keys 1\n") && strings.Contains(m, "idem_review_oldest_age_seconds") &&
			strings.Contains(m, `idem_review_webhook_events_total{result="delivered"} 1`)
	})
}
