package main_test

// Attacks on idem serve and the admin commands through the built binary:
// a SIGTERM that outlasts an in-flight upstream call, store URLs that
// must not create a store, terminal escapes in what the key commands
// print, and a request an anonymous client can park in review. Tests
// skipped with "finding N: …" failed against the code when they were
// written.

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// TestAttackSIGTERMOutlastedByUpstream: SIGTERM arrives while the
// upstream holds a protected request longer than --shutdown-timeout. The
// process exits without an answer; the key must not run again nor stay
// reserved for ever: once its lease expires, the retry (on a new process
// over the same store) finds it in review, and the upstream ran once.
func TestAttackSIGTERMOutlastedByUpstream(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	up := faultUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the upstream closes
	store := sqliteStore(t)
	args := []string{"--upstream", up.URL, "--store", store, "--lease", "1s"}
	p := startProxy(t, append(args, "--shutdown-timeout", "200ms")...)
	done := make(chan error, 1)
	go func() { _, err := try(t, "http://"+p.addr+"/slow", "k"); done <- err }()
	waitRuns(t, up, "/slow", 1)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("idem serve did not exit after SIGTERM")
	}
	if err := <-done; err == nil {
		t.Log("the client got an answer after all")
	}
	once.Do(func() { close(release) })

	second := startProxy(t, args...)
	var last answer
	eventually(t, "the key in review", func() bool {
		a, err := try(t, "http://"+second.addr+"/slow", "k")
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		last = a
		if a.status != http.StatusConflict {
			t.Fatalf("retry: %d %s; want 409 (in flight, then in review)", a.status, a.body)
		}
		return a.problemType() == "needs-review"
	})
	want(t, "the last retry", last.problemType(), "needs-review")
	want(t, "upstream runs", up.runs("/slow"), 1)
}

// TestAttackKeyCommandsNeverCreate: --store URLs that name no existing
// SQLite file, in every spelling (the sqlite3 scheme, an absolute path
// with parameters, a folder that does not exist, a dangling symlink), are
// an error for every key command, and nothing is created: not the file,
// not its -wal or -shm, not the symlink's target.
func TestAttackKeyCommandsNeverCreate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, "target.db"), filepath.Join(dir, "link.db")); err != nil {
		t.Fatal(err)
	}
	id := idemadmin.KeyID(idemstore.Key{Scope: "s", Operation: "POST /x", Key: "k"})
	for _, store := range []string{
		"sqlite3://idem.db",
		"sqlite://" + filepath.Join(dir, "abs.db") + "?busy_timeout=1s&synchronous=full",
		"sqlite://" + filepath.Join(dir, "no", "such", "dir.db"),
		"sqlite://link.db",
	} {
		for _, args := range [][]string{
			{"keys", "get", id},
			{"keys", "list", "--state", "pending"},
			{"review", "list", "--json"},
			{"review", "resolve", id, "--status", "201", "--body", "x"},
		} {
			cmd := exec.Command(binary, append(args, "--store", store)...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "IDEM_ADMIN_URL=", "IDEM_ADMIN_TOKEN=")
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "does not exist") {
				t.Errorf("idem %v --store %s: %v\n%s", args, store, err, out)
			}
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "link.db" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the commands created %v", names)
	}
}

// TestAttackJSONListsEscapeTerminalControls: a request path carrying C1
// controls (U+009B is CSI on terminals that honour 8-bit controls, so
// "\u009b2J" clears the screen), a bidirectional override and DEL lands in
// a record. `idem review list` and `idem keys list` print it escaped in
// their tables; with --json, whose output lands on the same terminals,
// JSON escapes must cover the same characters.
func TestAttackJSONListsEscapeTerminalControls(t *testing.T) {
	t.Parallel()
	t.Skip("finding 8: --json output (internal/cli/keys.go:91 and :150, json.Encoder) writes C1 controls (U+0080-U+009F, e.g. CSI U+009B), DEL and bidi overrides raw, though the tables escape them with idemadmin.Visible")
	up := faultUpstream(t, func(w http.ResponseWriter, r *http.Request) { hangUp(w) })
	store := sqliteStore(t)
	tf := tokenFile(t)
	p := startProxy(t, "--upstream", up.URL, "--store", store, "--admin", "127.0.0.1:0", "--admin-token-file", tf)
	want(t, "reset", do(t, "POST", "http://"+p.addr+"/reset%C2%9B2J%E2%80%AE%7F?q=%C2%9B", "k", `{}`).status, 502)
	bad := []string{"\u009b", "\u202e", "\x7f", "\x1b"}
	for _, args := range [][]string{
		{"review", "list", "--store", store},
		{"review", "list", "--json", "--store", store},
		{"keys", "list", "--json", "--admin-url", "http://" + p.admin, "--admin-token-file", tf},
		{"keys", "get", "--json", "--store", store, "--scope", "anonymous", "--operation", "POST /reset\u009b2J\u202e\x7f", "--key", "k"},
	} {
		out, err := exec.Command(binary, args...).Output()
		if err != nil {
			t.Fatalf("idem %q: %v\n%s", args, err, out)
		}
		if !strings.Contains(string(out), "reset") {
			t.Fatalf("idem %q does not show the key:\n%s", args, out)
		}
		var raw []string
		for _, c := range bad {
			if strings.Contains(string(out), c) {
				raw = append(raw, c)
			}
		}
		if len(raw) > 0 {
			t.Errorf("idem %q prints %q raw", args, raw)
		}
		if args[2] == "--json" || args[1] == "get" {
			var v any
			if err := json.Unmarshal(out, &v); err != nil {
				t.Errorf("idem %q: not JSON: %v", args, err)
			}
		}
	}
}

// TestAttackAnonymousClientFillsReview: any client, without credentials
// and without the upstream failing, sends a protected request with an
// Upgrade value that ReverseProxy refuses to forward (a tab in it). The
// proxy drops a protected request's Upgrade, so each runs once, as a plain
// request, and none is parked in review, where each such request would
// page an operator through the log, the gauge and the webhook.
func TestAttackAnonymousClientFillsReview(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--admin", "127.0.0.1:0", "--admin-token-file", tokenFile(t))
	for _, k := range []string{"spam-1", "spam-2", "spam-3"} {
		do(t, "POST", "http://"+p.addr+"/pay", k, `{}`, "Connection", "Upgrade", "Upgrade", "x\ty")
	}
	want(t, "upstream runs, one per key", up.runs("/pay"), 3)
	for _, k := range []string{"spam-1", "spam-2", "spam-3"} {
		want(t, "retry of "+k, do(t, "POST", "http://"+p.addr+"/pay", k, `{}`, "Connection", "Upgrade", "Upgrade", "x\ty").header.Get("Idempotent-Replayed"), "true")
	}
	want(t, "upstream runs after the retries", up.runs("/pay"), 3)
	if items := reviewList(t, p); len(items) != 0 {
		t.Fatalf("%d keys in review from requests that never reached the upstream: %s (%s)", len(items), items[0].Key, items[0].Reason)
	}
	want(t, "a retry", do(t, "POST", "http://"+p.addr+"/pay", "spam-1", `{}`).status, http.StatusCreated)
}
