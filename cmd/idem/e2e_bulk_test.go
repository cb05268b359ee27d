package main_test

// End-to-end tests of bulk actions from the command line: a list to read
// first, then one action for many keys, each fenced to the attempt listed.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReviewBulkCommand: three keys go to review; idem review list --json
// writes them down, idem review bulk without --yes lists them and changes
// nothing, and with --yes releases them, except one that was settled and
// sent to review again in the meantime, which is skipped and reported
// (exit 1). The same through the store itself.
func TestReviewBulkCommand(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	tf := tokenFile(t)
	store := sqliteStore(t)
	p := startProxy(t, "--upstream", up.URL, "--store", store, "--admin", "127.0.0.1:0", "--admin-token-file", tf)
	base := "http://" + p.addr
	admin := []string{"--admin-url", "http://" + p.admin, "--admin-token-file", tf}
	for _, k := range []string{"order-1", "order-2", "order-3"} {
		want(t, "status of "+k, do(t, "POST", base+"/reset?currency=eur", k, `{}`).status, 502)
	}
	out, code := idemCmd(t, nil, append([]string{"review", "list", "--json"}, admin...)...)
	if code != 0 {
		t.Fatalf("review list: %d\n%s", code, out)
	}
	list := filepath.Join(t.TempDir(), "stuck.json")
	if err := os.WriteFile(list, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}

	// Without --yes: the plan, nothing changed, exit 2.
	out, code = idemCmd(t, nil, append([]string{"review", "bulk", "--from", list, "--release", "--note", "provider has none"}, admin...)...)
	if code != 2 || !strings.Contains(out, "Release these 3 keys") || !strings.Contains(out, "POST /reset?currency=eur") ||
		!strings.Contains(out, "order-2") || !strings.Contains(out, "run again with --yes") {
		t.Fatalf("bulk without --yes: exit %d\n%s", code, out)
	}
	want(t, "a retry after the plan", do(t, "POST", base+"/reset?currency=eur", "order-1", `{}`).status, 409)

	// order-2 is settled by someone else and goes to review again.
	items := reviewList(t, p)
	for _, it := range items {
		if it.Key == "order-2" {
			a := adminCall(t, p, "POST", "/api/v1/keys/"+it.ID+"/resolve", adminToken, `{"action":"release","attempt":"`+it.Attempt+`"}`)
			want(t, "release of order-2", a.status, 200)
		}
	}
	want(t, "order-2 again", do(t, "POST", base+"/reset?currency=eur", "order-2", `{}`).status, 502)
	out, code = idemCmd(t, nil, append([]string{"review", "bulk", "--from", list, "--release", "--note", "provider has none"}, admin...)...)
	if code != 2 || !strings.Contains(out, "will be skipped: attempt") {
		t.Fatalf("the plan does not say order-2 changed: exit %d\n%s", code, out)
	}
	out, code = idemCmd(t, nil, append([]string{"review", "bulk", "--from", list, "--release", "--note", "provider has none", "--yes"}, admin...)...)
	if code != 1 || !strings.Contains(out, "stale_attempt") || !strings.Contains(out, "2 settled, 1 skipped") {
		t.Fatalf("bulk --yes: exit %d\n%s", code, out)
	}
	want(t, "order-1 runs again", do(t, "POST", base+"/reset?currency=eur", "order-1", `{}`).status, 502)
	want(t, "order-2 stays in review", do(t, "POST", base+"/reset?currency=eur", "order-2", `{}`).status, 409)
	eventually(t, "the audit lines", func() bool {
		return strings.Count(p.log(), `msg="admin: key resolved" by=ops action=release`) == 3 &&
			strings.Contains(p.log(), `msg="admin: bulk action" by=ops action=release keys=3 settled=2 skipped=1`)
	})

	// Through the store itself, ID:ATTEMPT arguments, one answer for all.
	items = reviewList(t, p)
	var args []string
	for _, it := range items {
		args = append(args, it.ID+":"+it.Attempt)
	}
	if len(args) != 2 {
		t.Fatalf("%d keys in review, want 2 (order-1 again and order-2)", len(args))
	}
	out, code = idemCmd(t, nil, append([]string{"review", "bulk", "--store", store, "--status", "201", "--header", "Content-Type: application/json",
		"--body", `{"charged":true}`, "--yes"}, args...)...)
	if code != 0 || !strings.Contains(out, "2 settled, 0 skipped") {
		t.Fatalf("bulk complete on the store: exit %d\n%s", code, out)
	}
	a := do(t, "POST", base+"/reset?currency=eur", "order-2", `{}`)
	want(t, "the answer stored in bulk", a.body, `{"charged":true}`)

	// Usage errors: exit 2, nothing changed.
	for _, bad := range [][]string{
		{"review", "bulk", "--release", "--yes", "no-colon"},
		{"review", "bulk", "--release", "--status", "201", "--yes", args[0]},
		{"review", "bulk", "--release", "--yes"},
	} {
		if out, code := idemCmd(t, nil, append(bad, admin...)...); code != 2 {
			t.Errorf("%v: exit %d\n%s", bad, code, out)
		}
	}
}
