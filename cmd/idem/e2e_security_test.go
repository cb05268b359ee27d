package main_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestSessionCookiesScopeKeys is the case of an API that authenticates by
// cookie: Alice and Mallory send the same key, each with their own session,
// and each gets their own answer.
func TestSessionCookiesScopeKeys(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxyAs(t, "--upstream", up.URL, "--store", "memory://", "--scope-cookie", "session")
	alice := do(t, "POST", "http://"+p.addr+"/orders", "order-1", `{}`, "Cookie", "session=alice-5e55")
	mallory := do(t, "POST", "http://"+p.addr+"/orders", "order-1", `{}`, "Cookie", "session=mallory-666")
	want(t, "alice", alice.status, 201)
	want(t, "mallory", mallory.status, 201)
	want(t, "mallory replayed", mallory.header.Get("Idempotent-Replayed"), "")
	if alice.body == mallory.body {
		t.Fatalf("Mallory got Alice's answer: %s", mallory.body)
	}
	again := do(t, "POST", "http://"+p.addr+"/orders", "order-1", `{}`, "Cookie", "theme=dark; session=alice-5e55")
	want(t, "alice's retry replayed", again.header.Get("Idempotent-Replayed"), "true")
	want(t, "alice's retry body", again.body, alice.body)
	want(t, "upstream runs", up.runs("/orders"), 2)
}

func TestAnonymousRequests(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	strict := startProxyAs(t, "--upstream", up.URL, "--store", "memory://")
	a := do(t, "POST", "http://"+strict.addr+"/pay", "k", `{}`)
	want(t, "default: status", a.status, 401)
	want(t, "default: problem", a.problemType(), "scope-missing")
	want(t, "default: outcome", a.header.Get("Idempotency-Outcome"), "scope_missing")
	want(t, "upstream runs without credentials", up.runs("/pay"), 0)
	want(t, "GET passes", do(t, "GET", "http://"+strict.addr+"/pay", "", "").status, 201)

	shared := startProxyAs(t, "--upstream", up.URL, "--store", "memory://", "--anonymous", "shared")
	want(t, "shared: status", do(t, "POST", "http://"+shared.addr+"/pay", "k", `{}`).status, 201)
	if !strings.Contains(shared.log(), "share one scope") {
		t.Error("--anonymous shared does not warn at startup")
	}
	if !strings.Contains(strict.log(), "unkeyed") {
		t.Error("no warning that scopes are unkeyed without a secret")
	}
}

func writeSecret(t *testing.T, secret string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scope.secret")
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKeyedScopesShareAStore: instances given the same secret agree on the
// scope, so they replay each other's answers; another secret is another
// scope. No file of the store holds the credential or its SHA-256.
func TestKeyedScopesShareAStore(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	db := filepath.Join(t.TempDir(), "idem.db")
	store := "sqlite://" + db
	same := writeSecret(t, "0123456789abcdef-shared-secret")
	a := startProxyAs(t, "--upstream", up.URL, "--store", store, "--scope-secret-file", same)
	b := startProxyAs(t, "--upstream", up.URL, "--store", store, "--scope-secret-file", same)
	c := startProxyAs(t, "--upstream", up.URL, "--store", store, "--scope-secret-file", writeSecret(t, "another-secret-of-16+bytes"))
	const cred = "Bearer sk_live_4f9a7c1e0b2d"
	first := do(t, "POST", "http://"+a.addr+"/pay", "k", `{}`, "Authorization", cred)
	viaB := do(t, "POST", "http://"+b.addr+"/pay", "k", `{}`, "Authorization", cred)
	want(t, "first", first.status, 201)
	want(t, "same secret replays", viaB.header.Get("Idempotent-Replayed"), "true")
	want(t, "same secret body", viaB.body, first.body)
	viaC := do(t, "POST", "http://"+c.addr+"/pay", "k", `{}`, "Authorization", cred)
	want(t, "another secret runs again", viaC.header.Get("Idempotent-Replayed"), "")
	want(t, "upstream runs", up.runs("/pay"), 2)
	if strings.Contains(a.log(), "unkeyed") {
		t.Error("a keyed proxy warns that scopes are unkeyed")
	}
	for _, p := range []*proxy{a, b, c} {
		p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.exited
	}
	sum := sha256.Sum256([]byte(cred))
	assertNotInFiles(t, db, cred, hex.EncodeToString(sum[:]), strings.TrimPrefix(cred, "Bearer "))
}

// assertNotInFiles fails if any file of the SQLite store db holds one of
// needles.
func assertNotInFiles(t *testing.T, db string, needles ...string) {
	t.Helper()
	files, _ := filepath.Glob(db + "*")
	if len(files) == 0 {
		t.Fatal("no SQLite files")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range needles {
			if bytes.Contains(b, []byte(n)) {
				t.Errorf("%s holds %q", filepath.Base(f), n)
			}
		}
	}
}

func TestScopeSecretErrors(t *testing.T) {
	t.Parallel()
	short := writeSecret(t, "too-short")
	out, err := runIdem(t, nil, "serve", "--upstream", "http://127.0.0.1:1", "--store", "memory://", "--listen", "127.0.0.1:0", "--scope-secret-file", short)
	if err == nil || !strings.Contains(out, "at least 16") {
		t.Errorf("a short secret: %v\n%s", err, out)
	}
	out, err = runIdem(t, []string{"IDEM_SCOPE_SECRET=0123456789abcdef0123"}, "serve", "--upstream", "http://127.0.0.1:1", "--store", "memory://", "--listen", "127.0.0.1:0", "--scope-secret-file", writeSecret(t, "0123456789abcdef0123"))
	if err == nil || !strings.Contains(out, "keep one") {
		t.Errorf("a secret in both places: %v\n%s", err, out)
	}
	out, err = runIdem(t, nil, "serve", "--upstream", "http://127.0.0.1:1", "--anonymous", "open")
	if err == nil || !strings.Contains(out, "reject or shared") {
		t.Errorf("--anonymous open: %v\n%s", err, out)
	}
}

// TestListenerLimits: a client trickling its body is cut off by the read
// timeout before its key is reserved, and oversized headers get 431.
func TestListenerLimits(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", "memory://", "--read-timeout", "1s", "--max-header-bytes", "4096", "--admin", ":0")
	if host, _, _ := net.SplitHostPort(p.admin); host != "127.0.0.1" {
		t.Errorf("--admin :0 bound %s, not loopback", p.admin)
	}

	conn, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /slow HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow-1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"amount\":")
	// The server answers or closes once the read timeout ends; the client
	// never sends the rest.
	resp, _ := io.ReadAll(bufio.NewReader(conn))
	if bytes.HasPrefix(resp, []byte("HTTP/1.1 2")) {
		t.Fatalf("a trickled request was answered: %s", resp)
	}
	want(t, "upstream runs of the trickled request", up.runs("/slow"), 0)
	// The key was never reserved: a complete request with it runs.
	want(t, "complete retry", do(t, "POST", "http://"+p.addr+"/slow", "slow-1", `{"amount":1}`).status, 201)

	big := do(t, "POST", "http://"+p.addr+"/pay", "k", `{}`, "X-Padding", strings.Repeat("a", 32<<10))
	want(t, "oversized headers", big.status, 431)
	want(t, "upstream runs of the oversized request", up.runs("/pay"), 0)
}

// runIdem runs the binary to its end with env added, and returns what it
// printed.
func runIdem(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), binary, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestSealedAnswersAtRest: with an encryption key, no file of the SQLite
// store holds an answer body, the credential or its SHA-256, and replays
// still give the first answer. A proxy without the key cannot open them,
// and does not run the request again either.
func TestSealedAnswersAtRest(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	db := filepath.Join(t.TempDir(), "idem.db")
	store := "sqlite://" + db
	keyFile := filepath.Join(t.TempDir(), "encryption.keys")
	if err := os.WriteFile(keyFile, []byte("# the first key seals\n2026-12:"+strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := writeSecret(t, "0123456789abcdef-shared-secret")
	p := startProxyAs(t, "--upstream", up.URL, "--store", store, "--scope-secret-file", secret, "--encryption-key-file", keyFile, "--store-request")
	const cred = "Bearer sk_live_4f9a7c1e0b2d"
	const reqMarker = "request-body-marker-5d1e"
	first := do(t, "POST", "http://"+p.addr+"/secret-answer", "k", `{"note":"`+reqMarker+`"}`, "Authorization", cred)
	want(t, "first", first.status, 201)
	if !strings.Contains(first.body, secretAnswer) {
		t.Fatalf("first answer %q", first.body)
	}
	again := do(t, "POST", "http://"+p.addr+"/secret-answer", "k", `{"note":"`+reqMarker+`"}`, "Authorization", cred)
	want(t, "replayed", again.header.Get("Idempotent-Replayed"), "true")
	want(t, "replayed body", again.body, first.body)
	if !strings.Contains(p.log(), "sealed") {
		t.Error("the proxy does not say that answers are sealed")
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	sum := sha256.Sum256([]byte(cred))
	assertNotInFiles(t, db, secretAnswer, reqMarker, cred, hex.EncodeToString(sum[:]))

	// Without the key the answer cannot be opened: no replay of garbage,
	// and the upstream does not run again.
	blind := startProxyAs(t, "--upstream", up.URL, "--store", store, "--scope-secret-file", secret)
	a := do(t, "POST", "http://"+blind.addr+"/secret-answer", "k", `{"note":"`+reqMarker+`"}`, "Authorization", cred)
	want(t, "without the key: status", a.status, 500)
	want(t, "without the key: problem", a.problemType(), "answer-sealed")
	if strings.Contains(a.body, secretAnswer) {
		t.Errorf("a proxy without the key answered %q", a.body)
	}
	want(t, "upstream runs", up.runs("/secret-answer"), 1)
}
