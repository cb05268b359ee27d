package main_test

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/idem-dev/idem/idemadmin"
)

// TestScopeLabelsSealedEndToEnd: idem serve --scope-label-header keeps the
// header's value with each new key. With --encryption-key-file it is
// sealed: no file of the SQLite store holds it, yet the admin API finds
// the key by it and shows it, as idem keys list --label does (idem serve's
// store searches and counts: its URL says so before it connects). A retry
// with another label replays, and the key keeps the first label.
func TestScopeLabelsSealedEndToEnd(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	db := filepath.Join(t.TempDir(), "idem.db")
	keyFile := filepath.Join(t.TempDir(), "encryption.keys")
	if err := os.WriteFile(keyFile, []byte("2026-12:"+strings.Repeat("cd", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const label = "acct_LABEL_77e1"
	p := startProxyAs(t, "--upstream", up.URL, "--store", "sqlite://"+db, "--encryption-key-file", keyFile,
		"--scope-label-header", "X-Account-Id", "--admin", "127.0.0.1:0", "--admin-token-file", tokenFile(t))
	const cred = "Bearer sk_live_4f9a7c1e0b2d"
	first := do(t, "POST", "http://"+p.addr+"/pay", "order-1001", `{}`, "Authorization", cred, "X-Account-Id", label)
	want(t, "first", first.status, 201)
	again := do(t, "POST", "http://"+p.addr+"/pay", "order-1001", `{}`, "Authorization", cred, "X-Account-Id", "acct_spoofed")
	want(t, "another label replays", again.header.Get("Idempotent-Replayed"), "true")
	want(t, "upstream runs", up.runs("/pay"), 1)

	search := func(l string) []idemadmin.Item {
		t.Helper()
		a := adminCall(t, p, "GET", "/api/v1/keys?label="+url.QueryEscape(l), adminToken, "")
		var page idemadmin.Page
		if a.status != 200 || json.Unmarshal([]byte(a.body), &page) != nil {
			t.Fatalf("label=%s: %d %s", l, a.status, a.body)
		}
		return page.Items
	}
	found := search(label)
	if len(found) != 1 || found[0].Key != "order-1001" || found[0].ScopeLabel != label {
		t.Fatalf("label=%s found %+v", label, found)
	}
	if got := search("acct_spoofed"); len(got) != 0 {
		t.Fatalf("the retry's label found %+v", got)
	}
	// The counts come through idem serve's store too.
	counts := adminCall(t, p, "GET", "/api/v1/counts", adminToken, "")
	var c idemadmin.Counts
	if counts.status != 200 || json.Unmarshal([]byte(counts.body), &c) != nil || c.Completed != 1 {
		t.Errorf("GET /api/v1/counts: %d %s", counts.status, counts.body)
	}
	out, err := runIdem(t, []string{"IDEM_ADMIN_TOKEN=" + adminToken, "IDEM_ADMIN_URL=http://" + p.admin}, "keys", "list", "--label", label)
	if err != nil || !strings.Contains(out, "order-1001") || !strings.Contains(out, label) {
		t.Errorf("idem keys list --label: %v\n%s", err, out)
	}

	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	assertNotInFiles(t, db, "LABEL_77e1", "acct_spoofed")
}

// TestScopeLabelHeaderRefusedAtStart: idem serve does not start with a
// label header that carries credentials or is a scope header, from a flag
// or from the config file, and says why.
func TestScopeLabelHeaderRefusedAtStart(t *testing.T) {
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "idem.yaml")
	if err := os.WriteFile(conf, []byte("upstream: http://127.0.0.1:1\nscope_label_header: X-Account-Id\nroutes:\n  - match: POST /orders\n    scope_label_header: Cookie\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scope-label-header", "Authorization"}, "Authorization carries credentials"},
		{[]string{"--scope-label-header", "proxy-authorization"}, "Proxy-Authorization carries credentials"},
		{[]string{"--scope-label-header", "Cookie"}, "Cookie carries credentials"},
		{[]string{"--scope-header", "X-Api-Key", "--scope-label-header", "x-api-key"}, "X-Api-Key is a scope header"},
		{[]string{"--config", conf}, `route "POST /orders": scope_label_header (--scope-label-header): Cookie carries credentials`},
	} {
		args := append([]string{"serve", "--upstream", "http://127.0.0.1:1", "--store", "memory://", "--listen", "127.0.0.1:0"}, tc.args...)
		out, err := runIdem(t, nil, args...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%v: %v; want an error saying %q\n%s", tc.args, err, tc.want, out)
		}
	}
}
