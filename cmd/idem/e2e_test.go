package main_test

// End-to-end tests: they build the real idem binary once, start it with
// flags against an httptest upstream that counts executions, and check what
// clients see and what the upstream ran.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-e2e")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "idem")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building idem: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// upstream is an API that counts how often each path ran. A request with
// ?hold=1 is held, once counted, until release is called (or the proxy
// drops its connection): a test that needs a request in flight holds it
// for as long as it needs, instead of hoping a sleep is long enough.
type upstream struct {
	*httptest.Server
	mu          sync.Mutex
	count       map[string]int
	held        chan struct{} // closed by release
	releaseOnce sync.Once
}

// secretAnswer is what /secret-answer puts in its body, to look for in the
// store's files.
const secretAnswer = "answer-body-7f3a9c21-only-in-the-answer"

func newUpstream(t *testing.T) *upstream {
	u := &upstream{count: map[string]int{}, held: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n := u.inc(r.URL.Path)
		if d, err := time.ParseDuration(r.URL.Query().Get("sleep")); err == nil {
			time.Sleep(d)
		}
		if r.URL.Query().Get("hold") != "" {
			io.Copy(io.Discard, r.Body) // and so hears when the proxy drops the connection
			select {
			case <-u.held:
			case <-r.Context().Done():
				return
			}
		}
		switch {
		case strings.HasPrefix(r.URL.Path, "/status/"):
			var code int
			fmt.Sscanf(strings.TrimPrefix(r.URL.Path, "/status/"), "%d", &code)
			w.WriteHeader(code)
			fmt.Fprintf(w, "status %d, run %d", code, n)
		case r.URL.Path == "/truncate":
			// Promise 100 bytes, send 10, and lose the connection.
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "0123456789")
			http.NewResponseController(w).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}
		case r.URL.Path == "/reset":
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}
		case r.URL.Path == "/secret-answer":
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"answer":%q,"run":%d}`, secretAnswer, n)
		default:
			http.SetCookie(w, &http.Cookie{Name: "session", Value: "s3cr3t"})
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Got-Key", r.Header.Get("Idempotency-Key"))
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"method":%q,"run":%d}`, r.Method, n)
		}
	})
	u.Server = httptest.NewServer(mux)
	t.Cleanup(u.Close)
	t.Cleanup(u.release) // before the server closes
	return u
}

// release lets the held requests answer, and those to come.
func (u *upstream) release() { u.releaseOnce.Do(func() { close(u.held) }) }

func (u *upstream) inc(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.count[path]++
	return u.count[path]
}

func (u *upstream) runs(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.count[path]
}

// proxy is a running idem serve process.
type proxy struct {
	cmd         *exec.Cmd
	addr, admin string
	mu          sync.Mutex
	stderr      bytes.Buffer
	exited      chan error
}

var listenRE = regexp.MustCompile(`msg="idem serve listening" proxy=(\S+)(?:.* admin=(\S+))?`)

// opName is the operation idem serve names a request to method and path
// by, as the proxies of startProxy name it.
func opName(method, path string) string { return method + " " + path + " host=* upstream=api" }

// startProxy runs the binary with args plus --listen 127.0.0.1:0 and waits
// for the address it logs. Unless args say otherwise, requests without
// credentials share one scope (--anonymous shared): most tests send none.
func startProxy(t *testing.T, args ...string) *proxy {
	t.Helper()
	if !slices.Contains(args, "--anonymous") {
		args = append([]string{"--anonymous", "shared"}, args...)
	}
	return startProxyAs(t, args...)
}

// startProxyAs is startProxy with args alone: the defaults of idem serve.
func startProxyAs(t *testing.T, args ...string) *proxy {
	t.Helper()
	return startProxyEnv(t, nil, args...)
}

// startProxyEnv is startProxyAs with env added to the environment.
func startProxyEnv(t *testing.T, env []string, args ...string) *proxy {
	t.Helper()
	p := &proxy{exited: make(chan error, 1)}
	// The processes of a test are reached each at its own address, where
	// clients in production reach every instance by one host name: unless
	// a test says otherwise, every host is one, and the upstream is named
	// "api", so that operations are named alike in all of them (opName).
	if !slices.Contains(args, "--host-alias") {
		args = append([]string{"--host-alias", "*"}, args...)
	}
	if !slices.Contains(args, "--upstream-name") {
		args = append([]string{"--upstream-name", "api"}, args...)
	}
	p.cmd = exec.Command(binary, append([]string{"serve", "--listen", "127.0.0.1:0", "--shutdown-timeout", "5s"}, args...)...)
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	pr, pw := io.Pipe()
	p.cmd.Stderr = pw
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.stderr.WriteString(line + "\n")
			p.mu.Unlock()
			if m := listenRE.FindStringSubmatch(line); m != nil {
				ready <- [2]string{m[1], m[2]}
			}
		}
	}()
	go func() { p.exited <- p.cmd.Wait(); pw.Close() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("idem serve stderr:\n%s", p.log())
		}
	})
	select {
	case a := <-ready:
		p.addr, p.admin = a[0], a[1]
	case err := <-p.exited:
		t.Fatalf("idem serve exited before listening: %v\n%s", err, p.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("idem serve did not log its address:\n%s", p.log())
	}
	return p
}

func (p *proxy) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) problemType() string {
	var pd struct{ Type string }
	json.Unmarshal([]byte(a.body), &pd)
	if i := strings.IndexByte(pd.Type, '#'); i >= 0 {
		return pd.Type[i+1:]
	}
	return pd.Type
}

// do sends one request; key "" sends no Idempotency-Key.
func do(t *testing.T, method, url, key, body string, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func want(t *testing.T, what string, got, wantV any) {
	t.Helper()
	if got != wantV {
		t.Errorf("%s = %v, want %v", what, got, wantV)
	}
}

func sqliteStore(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "idem.db") }

// writeConfig writes a YAML config file for idem serve and returns its path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestProtocol(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--max-body", "64")
	base := "http://" + p.addr

	t.Run("first call", func(t *testing.T) {
		a := do(t, "POST", base+"/pay", "k1", `{"amount":100}`)
		want(t, "status", a.status, 201)
		want(t, "body", a.body, `{"method":"POST","run":1}`)
		want(t, "forwarded key", a.header.Get("X-Got-Key"), "k1")
		if a.header.Get("Set-Cookie") == "" {
			t.Error("the first answer lost its Set-Cookie")
		}
	})
	t.Run("replay", func(t *testing.T) {
		a := do(t, "POST", base+"/pay", "k1", `{ "amount" : 100 }`)
		want(t, "status", a.status, 201)
		want(t, "body", a.body, `{"method":"POST","run":1}`)
		want(t, "Idempotent-Replayed", a.header.Get("Idempotent-Replayed"), "true")
		want(t, "Set-Cookie", a.header.Get("Set-Cookie"), "")
		want(t, "upstream runs", up.runs("/pay"), 1)
	})
	t.Run("mismatch 422", func(t *testing.T) {
		a := do(t, "POST", base+"/pay", "k1", `{"amount":200}`)
		want(t, "status", a.status, 422)
		want(t, "problem", a.problemType(), "key-reused")
		want(t, "upstream runs", up.runs("/pay"), 1)
	})
	t.Run("missing key 400", func(t *testing.T) {
		a := do(t, "POST", base+"/pay", "", `{}`)
		want(t, "status", a.status, 400)
		want(t, "problem", a.problemType(), "missing-key")
	})
	t.Run("invalid key 400", func(t *testing.T) {
		a := do(t, "POST", base+"/pay", "", `{}`, "Idempotency-Key", "a", "Idempotency-Key", "b")
		want(t, "status", a.status, 400)
		want(t, "problem", a.problemType(), "invalid-key")
		want(t, "upstream runs", up.runs("/pay"), 1)
	})
	t.Run("body over --max-body 413", func(t *testing.T) {
		a := do(t, "POST", base+"/big", "k-big", `{"pad":"`+strings.Repeat("x", 100)+`"}`)
		want(t, "status", a.status, 413)
		want(t, "upstream runs", up.runs("/big"), 0)
	})
	t.Run("GET passes through", func(t *testing.T) {
		for i := 1; i <= 2; i++ {
			a := do(t, "GET", base+"/items", "k-get", "")
			want(t, "status", a.status, 201)
			want(t, "Idempotent-Replayed", a.header.Get("Idempotent-Replayed"), "")
		}
		want(t, "upstream runs", up.runs("/items"), 2)
	})
	t.Run("upstream 429 and 503 release the key", func(t *testing.T) {
		for _, code := range []string{"429", "503"} {
			for i := 0; i < 2; i++ {
				a := do(t, "POST", base+"/status/"+code, "k-"+code, `{}`)
				want(t, "status", fmt.Sprint(a.status), code)
			}
			want(t, "upstream runs of "+code, up.runs("/status/"+code), 2)
		}
	})
	t.Run("upstream 500 is stored and replayed", func(t *testing.T) {
		first := do(t, "POST", base+"/status/500", "k-500", `{}`)
		second := do(t, "POST", base+"/status/500", "k-500", `{}`)
		want(t, "status", first.status, 500)
		want(t, "replayed status", second.status, 500)
		want(t, "replayed body", second.body, first.body)
		want(t, "Idempotent-Replayed", second.header.Get("Idempotent-Replayed"), "true")
		want(t, "upstream runs", up.runs("/status/500"), 1)
	})
	t.Run("in flight 409 with Retry-After", func(t *testing.T) {
		done := make(chan answer)
		go func() { done <- do(t, "POST", base+"/slow?hold=1", "k-slow", `{}`) }()
		waitRuns(t, up, "/slow", 1)
		a := do(t, "POST", base+"/slow?hold=1", "k-slow", `{}`)
		up.release() // only now may the first answer
		want(t, "status", a.status, 409)
		want(t, "problem", a.problemType(), "in-flight")
		if a.header.Get("Retry-After") == "" {
			t.Error("409 without Retry-After")
		}
		want(t, "first status", (<-done).status, 201)
		want(t, "upstream runs", up.runs("/slow"), 1)
	})
}

// waitRuns waits until the upstream ran path n times.
// waitReady waits until the proxy's /readyz says its store answers (a
// server store that is slow to connect at start is retried in the
// background).
func waitReady(t *testing.T, p *proxy) {
	t.Helper()
	for i := 0; do(t, "GET", "http://"+p.admin+"/readyz", "", "").status != http.StatusOK; i++ {
		if i > 300 {
			t.Fatalf("the proxy's store never became ready:\n%s", p.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitRuns(t *testing.T, up *upstream, path string, n int) {
	t.Helper()
	for i := 0; up.runs(path) < n; i++ {
		if i > 1000 {
			t.Fatalf("the upstream never ran %s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWaitReplays(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--wait", "10s")
	url := "http://" + p.addr + "/slow?sleep=700ms"
	done := make(chan answer)
	go func() { done <- do(t, "POST", url, "k", `{}`) }()
	waitRuns(t, up, "/slow", 1)
	a := do(t, "POST", url, "k", `{}`)
	first := <-done
	want(t, "waiting duplicate status", a.status, 201)
	want(t, "waiting duplicate body", a.body, first.body)
	want(t, "Idempotent-Replayed", a.header.Get("Idempotent-Replayed"), "true")
	want(t, "upstream runs", up.runs("/slow"), 1)
}

func TestOptionalKey(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--optional-key")
	for i := 0; i < 2; i++ {
		a := do(t, "POST", "http://"+p.addr+"/pay", "", `{}`)
		want(t, "status", a.status, 201)
	}
	want(t, "upstream runs without a key", up.runs("/pay"), 2)
	do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`)
	do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`)
	want(t, "upstream runs with a key", up.runs("/pay"), 3)
}

func TestUpstreamRefusedReleases(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	p := startProxy(t, "--upstream", dead, "--store", sqliteStore(t))
	for i := 0; i < 2; i++ {
		// The second attempt is forwarded again (502, not 409): the key was
		// released because nothing was sent.
		a := do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`)
		want(t, "status", a.status, 502)
		want(t, "problem", a.problemType(), "upstream-unreachable")
	}
}

// TestAmbiguousOutcomeNeedsReview: an upstream that had the request and then
// failed (a reset connection, or no answer within --upstream-timeout) may
// have run it, so the key needs review and the retry is not forwarded.
func TestAmbiguousOutcomeNeedsReview(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, path, problem string
		status              int
		args                []string
	}{
		{"reset after send", "/reset", "upstream-failed", 502, nil},
		{"upstream timeout", "/slow?hold=1", "upstream-timeout", 504, []string{"--upstream-timeout", "200ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			p := startProxy(t, append([]string{"--upstream", up.URL, "--store", sqliteStore(t)}, tc.args...)...)
			a := do(t, "POST", "http://"+p.addr+tc.path, "k", `{"amount":1}`)
			want(t, "status", a.status, tc.status)
			want(t, "problem", a.problemType(), tc.problem)
			a = do(t, "POST", "http://"+p.addr+tc.path, "k", `{"amount":1}`)
			want(t, "retry status", a.status, 409)
			want(t, "retry problem", a.problemType(), "needs-review")
			// The proxy gives up on a request it has sent; the upstream, slow
			// as it may be, reads it all the same.
			path := strings.SplitN(tc.path, "?", 2)[0]
			waitRuns(t, up, path, 1)
			want(t, "upstream runs", up.runs(path), 1)
		})
	}
}

// TestTruncatedAnswerNeedsReview: an upstream that answers and then loses
// the connection in the middle of its body ran the request, but its answer
// is lost; the client gets no answer, the key needs review, and nothing
// runs twice.
func TestTruncatedAnswerNeedsReview(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--admin", "127.0.0.1:0")
	req, _ := http.NewRequest("POST", "http://"+p.addr+"/truncate", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("Content-Type", "application/json") // as do sends it: the same request
	if resp, err := http.DefaultClient.Do(req); err == nil {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("a truncated upstream answer reached the client whole: %d %q", resp.StatusCode, b)
		}
	}
	a := do(t, "POST", "http://"+p.addr+"/truncate", "k", `{}`)
	want(t, "retry status", a.status, 409)
	want(t, "retry problem", a.problemType(), "needs-review")
	want(t, "upstream runs", up.runs("/truncate"), 1)
	metrics := do(t, "GET", "http://"+p.admin+"/metrics", "", "").body
	if !strings.Contains(metrics, `idem_proxy_requests_total{outcome="upstream_failed",route="default",settlement="escalated"} 1`) {
		t.Errorf("metrics do not count the escalated request:\n%s", grepLines(metrics, "idem_proxy_requests_total"))
	}
}

// grepLines returns the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestAmbiguousReleaseRoute: a route whose upstream dedups by the forwarded
// key opts into ambiguous: release, so after a reset the retry is forwarded
// again (TestAmbiguousOutcomeNeedsReview has the default).
func TestAmbiguousReleaseRoute(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--config", writeConfig(t, fmt.Sprintf(`upstream: %s
store: %s
routes:
  - match: POST /reset
    ambiguous: release
`, up.URL, sqliteStore(t))))
	for i := 1; i <= 2; i++ {
		a := do(t, "POST", "http://"+p.addr+"/reset", "k", `{}`)
		want(t, "status", a.status, 502)
		want(t, "problem", a.problemType(), "upstream-failed")
		want(t, "upstream runs", up.runs("/reset"), i)
	}
	// The forwarded key is what lets such an upstream dedup.
	want(t, "key forwarded", do(t, "POST", "http://"+p.addr+"/pay", "k2", `{}`).header.Get("X-Got-Key"), "k2")
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t))
	statuses := concurrently(t, 50, func(int) string { return "http://" + p.addr + "/pay?sleep=200ms" })
	want(t, "upstream runs", up.runs("/pay"), 1)
	if statuses[201] < 1 || statuses[201]+statuses[409] != 50 {
		t.Errorf("statuses = %v, want one or more 201 (replays) and the rest 409", statuses)
	}
}

func TestTwoProcessesShareSQLite(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	store := sqliteStore(t)
	p1 := startProxy(t, "--upstream", up.URL, "--store", store)
	p2 := startProxy(t, "--upstream", up.URL, "--store", store)
	statuses := concurrently(t, 20, func(i int) string {
		if i%2 == 0 {
			return "http://" + p1.addr + "/pay?sleep=200ms"
		}
		return "http://" + p2.addr + "/pay?sleep=200ms"
	})
	want(t, "upstream runs", up.runs("/pay"), 1)
	if statuses[201]+statuses[409] != 20 {
		t.Errorf("statuses = %v, want only 201 and 409", statuses)
	}
}

// TestTwoProcessesShareServerStore runs two proxies on each server store
// (PostgreSQL, MySQL, Redis, Redis Cluster) and sends concurrent duplicates
// to both: the upstream runs once, and a later retry through either proxy
// replays.
func TestTwoProcessesShareServerStore(t *testing.T) {
	t.Parallel()
	schema := fmt.Sprintf("e2e_%d", time.Now().UnixNano())
	pg := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	stores := []struct{ name, url string }{
		{"postgres", testenv.WithParam(pg, "schema", schema)},
		{"mysql", "mysql://" + testenv.Getenv(t, "IDEM_TEST_MYSQL_DSN")},
		{"redis", testenv.Getenv(t, "IDEM_TEST_REDIS_URL")},
		{"redis-cluster", "redis+cluster://" + testenv.Getenv(t, "IDEM_TEST_REDIS_CLUSTER")},
	}
	t.Cleanup(func() {
		// The schema the proxies created; the other stores keep this run's
		// records only until their retention ends.
		exec.Command("psql", pg, "-qc", "DROP SCHEMA IF EXISTS "+schema+" CASCADE").Run()
	})
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			p1 := startProxy(t, "--upstream", up.URL, "--store", st.url, "--admin", "127.0.0.1:0")
			p2 := startProxy(t, "--upstream", up.URL, "--store", st.url, "--admin", "127.0.0.1:0")
			waitReady(t, p1)
			waitReady(t, p2)
			key := fmt.Sprintf("e2e-%s-%d", st.name, time.Now().UnixNano()) // the servers outlive this run
			proxies := []*proxy{p1, p2}
			statuses := concurrentlyWithKey(t, 20, key, func(i int) string {
				return "http://" + proxies[i%2].addr + "/pay?sleep=200ms"
			})
			want(t, "upstream runs", up.runs("/pay"), 1)
			if statuses[201]+statuses[409] != 20 {
				t.Errorf("statuses = %v, want only 201 and 409", statuses)
			}
			for _, p := range proxies {
				a := do(t, "POST", "http://"+p.addr+"/pay?sleep=200ms", key, `{"amount":5}`)
				want(t, "retry status", a.status, 201)
				want(t, "retry replayed", a.header.Get("Idempotent-Replayed"), "true")
			}
			want(t, "upstream runs after retries", up.runs("/pay"), 1)
		})
	}
}

// concurrently sends n POSTs with one key at once and counts the statuses.
func concurrently(t *testing.T, n int, url func(i int) string) map[int]int {
	return concurrentlyWithKey(t, n, "same-key", url)
}

// concurrentlyWithKey is concurrently with the given Idempotency-Key.
func concurrentlyWithKey(t *testing.T, n int, key string, url func(i int) string) map[int]int {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		start    = make(chan struct{})
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a := do(t, "POST", url(i), key, `{"amount":5}`)
			mu.Lock()
			statuses[a.status]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return statuses
}

func TestStoreUnreachable(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	for _, store := range []string{"postgres://idem:pw@127.0.0.1:1/x?connect_timeout=1", "redis://127.0.0.1:1/0"} {
		p := startProxy(t, "--upstream", up.URL, "--store", store, "--admin", "127.0.0.1:0")
		a := do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`)
		want(t, store+": status", a.status, 503)
		want(t, store+": problem", a.problemType(), "store-unavailable")
		a = do(t, "GET", "http://"+p.addr+"/items", "", "")
		want(t, store+": GET status", a.status, 201)
		a = do(t, "GET", "http://"+p.admin+"/readyz", "", "")
		want(t, store+": /readyz", a.status, 503)
		if strings.Contains(a.body, "127.0.0.1") {
			t.Errorf("%s: /readyz tells its caller where the store is: %q", store, a.body)
		}
		a = do(t, "GET", "http://"+p.admin+"/healthz", "", "")
		want(t, store+": /healthz", a.status, 200)
		if strings.Contains(p.log(), ":pw@") {
			t.Errorf("%s: the log shows the store password", store)
		}
	}
	want(t, "upstream runs of the protected path", up.runs("/pay"), 0)
	want(t, "upstream runs of the GET", up.runs("/items"), 2)
}

func TestCredentialsNotStored(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "idem.db")
	p := startProxy(t, "--upstream", up.URL, "--store", "sqlite://"+db)
	const secret = "sk_live_4f9a7c1e0b2d"
	for i := 0; i < 2; i++ {
		do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`, "Authorization", "Bearer "+secret)
	}
	// Another credential is another scope: the key runs again.
	do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`, "Authorization", "Bearer other")
	want(t, "upstream runs", up.runs("/pay"), 2)
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	files, _ := filepath.Glob(db + "*")
	if len(files) == 0 {
		t.Fatal("no SQLite files")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s holds the Authorization value in clear text", f)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct{ name, yaml, want string }{
		{"unknown field", "upstream: http://127.0.0.1:1\nlisten: 127.0.0.1:0\nretension: 24h\n", "line 3"},
		{"bad duration", "upstream: http://127.0.0.1:1\nroutes:\n  - match: POST /payments\n    wait: soon\n", `line 4: "soon" is not a duration`},
		{"bad pattern", "upstream: http://127.0.0.1:1\nroutes:\n  - match: POST payments\n", "line 3: match"},
		{"bad policy", "upstream: http://127.0.0.1:1\nambiguous: retry\n", "line 2: ambiguous must be escalate or release"},
		{"bad status", "upstream: http://127.0.0.1:1\nrelease_statuses: [429, 42]\n", `line 2: "42" is not an HTTP status code`},
		{"no upstream", "listen: 127.0.0.1:0\n", "upstream is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".yaml")
			os.WriteFile(path, []byte(tt.yaml), 0o600)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, binary, "serve", "--config", path).CombinedOutput()
			if err == nil {
				t.Fatalf("idem serve started with an invalid file:\n%s", out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("output %q does not contain %q", out, tt.want)
			}
		})
	}
}

func TestConfigRoutes(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--config", writeConfig(t, fmt.Sprintf(`upstream: %s
store: %s
routes:
  - match: POST /webhooks/
    disabled: true
  - match: PUT /items/{id}
    exclude_fields: [/ts]
`, up.URL, sqliteStore(t))))
	base := "http://" + p.addr
	do(t, "POST", base+"/webhooks/a", "", `{}`)
	do(t, "POST", base+"/webhooks/a", "", `{}`)
	want(t, "disabled route runs", up.runs("/webhooks/a"), 2)
	a := do(t, "PUT", base+"/items/7", "k", `{"v":1,"ts":1}`)
	b := do(t, "PUT", base+"/items/7", "k", `{"v":1,"ts":2}`)
	want(t, "PUT first", a.status, 201)
	want(t, "PUT retry with an excluded field changed", b.header.Get("Idempotent-Replayed"), "true")
	want(t, "PUT runs", up.runs("/items/7"), 1)
	want(t, "PUT without key", do(t, "PUT", base+"/items/8", "", `{}`).status, 400)
	want(t, "default route still protected", do(t, "POST", base+"/pay", "", `{}`).status, 400)
}

func TestSIGTERMFinishesInFlight(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t))
	done := make(chan answer)
	go func() { done <- do(t, "POST", "http://"+p.addr+"/slow?sleep=700ms", "k", `{}`) }()
	waitRuns(t, up, "/slow", 1)
	p.cmd.Process.Signal(syscall.SIGTERM)
	a := <-done
	want(t, "in-flight status", a.status, 201)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Errorf("idem serve exited with %v after SIGTERM", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("idem serve did not exit after SIGTERM")
	}
	if !strings.Contains(p.log(), "msg=stopped") {
		t.Error("no graceful stop in the log")
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(binary, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "idem ") || !strings.Contains(string(out), "go1") {
		t.Errorf("idem version = %q, %v", out, err)
	}
}

func TestDemoShowsFiveBehaviours(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// With no flag the demo stops by itself after its walkthrough.
	out, err := exec.CommandContext(ctx, binary, "demo", "--listen", "127.0.0.1:0").CombinedOutput()
	if err != nil {
		t.Fatalf("idem demo: %v\n%s", err, out)
	}
	s := string(out)
	for _, w := range []string{
		"HTTP 201 Created\nIdempotency-Outcome: acquired",
		"Idempotent-Replayed: true",
		"HTTP 422 Unprocessable Entity",
		"HTTP 409 Conflict\nIdempotency-Outcome: in_flight\nRetry-After:",
		"HTTP 400 Bad Request\nIdempotency-Outcome: missing_key",
		"The payments API ran 2 times for these 6 requests.",
		"The demo is done and has stopped",
		`idem demo --serve`,
	} {
		if !strings.Contains(s, w) {
			t.Errorf("demo output lacks %q:\n%s", w, s)
		}
	}
}

// TestDemoServeKeepsRunning: with --serve the demo says that it keeps
// running and how to stop it, serves requests of the user's own, and stops
// on an interrupt.
func TestDemoServeKeepsRunning(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "demo", "--serve", "--no-run", "--listen", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	base := ""
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		seen.WriteString(line + "\n")
		if m := regexp.MustCompile(`the proxy on (http://\S+) guards`).FindStringSubmatch(line); m != nil {
			base = m[1]
		}
		if strings.Contains(line, "keeps running until you press Ctrl-C") {
			break
		}
	}
	if base == "" || !strings.Contains(seen.String(), "keeps running until you press Ctrl-C") {
		_ = cmd.Process.Kill()
		t.Fatalf("idem demo --serve does not say that it keeps running:\n%s", seen.String())
	}
	resp, err := http.Get(base + "/payments")
	if err != nil {
		t.Fatalf("GET %s/payments while the demo serves: %v", base, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /payments: %d", resp.StatusCode)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	if err := cmd.Wait(); err != nil {
		t.Errorf("idem demo --serve after SIGINT: %v", err)
	}
}

func TestMigrateAndPurge(t *testing.T) {
	t.Parallel()
	store := sqliteStore(t)
	out, err := exec.Command(binary, "migrate", "--store", store).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "schema up to date") {
		t.Fatalf("idem migrate: %v\n%s", err, out)
	}
	out, err = exec.Command(binary, "purge", "--store", store, "--batch", "10").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "purged 0 expired records") {
		t.Fatalf("idem purge: %v\n%s", err, out)
	}

	// 25 completed records whose retention ended, and one still kept.
	db, err := idemsqlite.Open(strings.TrimPrefix(store, "sqlite://"), idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i := range 26 {
		key := idemstore.Key{Scope: "s", Operation: "POST /pay", Key: fmt.Sprint(i)}
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key, Fingerprint: "f", Token: "t", Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		retention := -time.Minute
		if i == 25 {
			retention = time.Hour
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: key, Token: "t", Response: &idemstore.Response{Status: 201}, Retention: retention}); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	out, err = exec.Command(binary, "purge", "--store", store, "--batch", "10").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "purged 10 records so far") || !strings.Contains(string(out), "purged 25 expired records") {
		t.Fatalf("idem purge of 25 expired records in batches of 10: %v\n%s", err, out)
	}
	out, err = exec.Command(binary, "migrate", "--store", "memory://").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nothing to migrate") {
		t.Errorf("idem migrate on memory: %v\n%s", err, out)
	}
	out, err = exec.Command(binary, "purge", "--store", "nosuch://x").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "unknown scheme") {
		t.Errorf("idem purge with a bad URL: %v\n%s", err, out)
	}
}

func TestAdminMetricsAndReadiness(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--admin", "127.0.0.1:0")
	base := "http://" + p.addr
	do(t, "POST", base+"/pay", "m1", `{}`)
	do(t, "POST", base+"/pay", "m1", `{}`)
	do(t, "POST", base+"/pay", "", `{}`)
	want(t, "/readyz", do(t, "GET", "http://"+p.admin+"/readyz", "", "").status, 200)
	m := do(t, "GET", "http://"+p.admin+"/metrics", "", "")
	want(t, "/metrics status", m.status, 200)
	for _, series := range []string{
		`idem_proxy_requests_total{outcome="acquired"`,
		`idem_proxy_requests_total{outcome="replayed",route="default"`,
		`idem_proxy_requests_total{outcome="missing_key"`,
		`idem_store_duration_seconds_bucket`,
		`idem_upstream_duration_seconds_bucket`,
	} {
		if !strings.Contains(m.body, series) {
			t.Errorf("/metrics lacks %s:\n%s", series, m.body)
		}
	}
}

func TestMigrateServerStores(t *testing.T) {
	t.Parallel()
	pg := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	my := "mysql://" + testenv.Getenv(t, "IDEM_TEST_MYSQL_DSN")
	for _, store := range []string{pg, my} {
		// Twice: migrating an up-to-date schema is a no-op.
		for i := 0; i < 2; i++ {
			out, err := exec.Command(binary, "migrate", "--store", store).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "schema up to date") {
				t.Fatalf("idem migrate --store %s: %v\n%s", store, err, out)
			}
		}
	}
	// Redis has no schema: migrate builds the search indexes of the
	// records written before them (none under a fresh prefix).
	redis := testenv.WithParam(testenv.Getenv(t, "IDEM_TEST_REDIS_URL"), "prefix", fmt.Sprintf("idem_e2e_migrate_%d", time.Now().UnixNano()))
	out, err := exec.Command(binary, "migrate", "--store", redis).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "search indexes up to date (0 records indexed)") {
		t.Fatalf("idem migrate --store %s: %v\n%s", redis, err, out)
	}
}

// TestReviewListAndResolve settles keys the proxy sent to review, with the
// operator commands, while the proxy runs on the same SQLite file.
func TestReviewListAndResolve(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	store := sqliteStore(t)
	p := startProxy(t, "--upstream", up.URL, "--store", store)
	base := "http://" + p.addr
	for _, k := range []string{"lost", "charged"} {
		want(t, "status of "+k, do(t, "POST", base+"/reset", k, `{}`).status, 502)
	}
	out, err := exec.Command(binary, "review", "list", "--store", store, "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("review list: %v\n%s", err, out)
	}
	var rows []struct{ Scope, Operation, Key, Reason string }
	if err := json.Unmarshal(out, &rows); err != nil || len(rows) != 2 {
		t.Fatalf("review list: %v, %d rows\n%s", err, len(rows), out)
	}
	if rows[0].Operation != opName("POST", "/reset") || rows[0].Reason == "" {
		t.Fatalf("review list row %+v", rows[0])
	}
	scope := rows[0].Scope
	resolve := func(args ...string) {
		t.Helper()
		cmd := append([]string{"review", "resolve", "--store", store, "--scope", scope, "--operation", opName("POST", "/reset")}, args...)
		if out, err := exec.Command(binary, cmd...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	resolve("--key", "lost", "--release", "--reason", "never reached the provider", "--any-attempt")
	resolve("--key", "charged", "--any-attempt", "--status", "201", "--header", "Content-Type: application/json", "--body", `{"charge":"ch_1"}`)

	// Released: the retry is forwarded again (and fails again on /reset).
	want(t, "released retry", do(t, "POST", base+"/reset", "lost", `{}`).status, 502)
	want(t, "upstream runs", up.runs("/reset"), 3)
	// Completed by the operator: the retry gets that answer.
	a := do(t, "POST", base+"/reset", "charged", `{}`)
	want(t, "resolved status", a.status, 201)
	want(t, "resolved body", a.body, `{"charge":"ch_1"}`)
	want(t, "Idempotent-Replayed", a.header.Get("Idempotent-Replayed"), "true")
	want(t, "upstream runs", up.runs("/reset"), 3)

	// Usage errors exit 2.
	err = exec.Command(binary, "review", "resolve", "--store", store, "--scope", scope, "--operation", opName("POST", "/reset"), "--key", "x").Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("resolve without --release or --status: %v", err)
	}
}
