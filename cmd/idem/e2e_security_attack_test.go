package main_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReadTimeoutDoesNotCutAnUpstreamCall: the read timeout bounds how long
// a client takes to send its request; an upstream that takes longer than
// it to answer is not the client's doing. Its answer reaches the client
// and is stored, and a retry replays it.
func TestReadTimeoutDoesNotCutAnUpstreamCall(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", "memory://", "--read-timeout", "1s")
	first := do(t, "POST", "http://"+p.addr+"/slow-call?sleep=2s", "k", `{}`)
	want(t, "first", first.status, 201)
	again := do(t, "POST", "http://"+p.addr+"/slow-call?sleep=2s", "k", `{}`)
	want(t, "retry replayed", again.header.Get("Idempotent-Replayed"), "true")
	want(t, "upstream runs", up.runs("/slow-call"), 1)
}

// TestReviewCLISealsWithTheProxysKey: an operator who settles a key with
// idem review resolve --store, in the environment idem serve runs in
// (IDEM_ENCRYPTION_KEY), stores the answer sealed like the proxy's own:
// the store's files never hold it in clear, and the proxy replays it.
// idem keys get opens what the proxy sealed.
func TestReviewCLISealsWithTheProxysKey(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	db := filepath.Join(t.TempDir(), "idem.db")
	store := "sqlite://" + db
	key := "2026-12:" + strings.Repeat("cd", 32)
	keyFile := filepath.Join(t.TempDir(), "encryption.keys")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"IDEM_ENCRYPTION_KEY=" + key}
	p := startProxy(t, "--upstream", up.URL, "--store", store, "--encryption-key-file", keyFile)
	want(t, "lost upstream", do(t, "POST", "http://"+p.addr+"/reset", "charged", `{}`).status, 502)
	want(t, "an answer to show", do(t, "POST", "http://"+p.addr+"/secret-answer", "shown", `{}`).status, 201)

	out, err := runIdem(t, env, "review", "list", "--store", store, "--json")
	if err != nil {
		t.Fatalf("review list: %v\n%s", err, out)
	}
	var rows []struct{ ID, Attempt string }
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("review list: %v\n%s", err, out)
	}
	const marker = "operator-answer-3c7e1b"
	out, err = runIdem(t, env, "review", "resolve", rows[0].ID, "--store", store, "--status", "201", "--body", `{"charge":"`+marker+`"}`, "--note", "charged per dashboard", "--attempt", rows[0].Attempt)
	if err != nil {
		t.Fatalf("review resolve: %v\n%s", err, out)
	}
	a := do(t, "POST", "http://"+p.addr+"/reset", "charged", `{}`)
	want(t, "resolved replay", a.status, 201)
	want(t, "resolved body", a.body, `{"charge":"`+marker+`"}`)

	out, err = runIdem(t, env, "keys", "list", "--store", store, "--state", "completed", "--json")
	if err != nil {
		t.Fatalf("keys list: %v\n%s", err, out)
	}
	var keys []struct{ ID, Key string }
	json.Unmarshal([]byte(out), &keys)
	shown := ""
	for _, k := range keys {
		if k.Key == "shown" {
			shown = k.ID
		}
	}
	if out, err = runIdem(t, nil, "keys", "get", shown, "--store", store, "--encryption-key-file", keyFile); err != nil || !strings.Contains(out, secretAnswer) {
		t.Errorf("keys get with the proxy's key does not open its answer: %v\n%s", err, out)
	}
	if out, err = runIdem(t, nil, "keys", "get", shown, "--store", store); err != nil || strings.Contains(out, secretAnswer) {
		t.Errorf("keys get without the key: %v\n%s", err, out)
	}

	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	assertNotInFiles(t, db, marker, secretAnswer)
}

// TestCredentialsNeverLogged: at debug level, through a replay, a
// refused anonymous request, a lost upstream and /metrics, neither the
// credential nor the session cookie, nor the plain SHA-256 of either,
// reaches the log, the metrics or a problem document.
func TestCredentialsNeverLogged(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	secret := writeSecret(t, "0123456789abcdef-log-secret")
	p := startProxyAs(t, "--upstream", up.URL, "--store", "memory://", "--log-level", "debug",
		"--scope-header", "Authorization", "--scope-cookie", "session", "--scope-secret-file", secret, "--admin", "127.0.0.1:0")
	const cred, cookie = "Bearer sk_live_logged_9e2f", "sess-logged-41b7"
	hdr := []string{"Authorization", cred, "Cookie", "session=" + cookie}
	var bodies []string
	for _, path := range []string{"/pay", "/pay", "/reset"} {
		bodies = append(bodies, do(t, "POST", "http://"+p.addr+path, "k", `{}`, hdr...).body)
	}
	bodies = append(bodies, do(t, "POST", "http://"+p.addr+"/pay", "k2", `{}`).body)
	bodies = append(bodies, do(t, "GET", "http://"+p.admin+"/metrics", "", "").body)
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	everything := p.log() + strings.Join(bodies, "\n")
	if !strings.Contains(p.log(), "msg=request") {
		t.Fatalf("no debug line per request:\n%s", p.log())
	}
	for _, s := range []string{cred, "sk_live_logged_9e2f", cookie} {
		sum := sha256.Sum256([]byte(s))
		for _, needle := range []string{s, hex.EncodeToString(sum[:])} {
			if strings.Contains(everything, needle) {
				t.Errorf("%q appears in the log, a problem document or /metrics", needle)
			}
		}
	}
}
