package main_test

// End-to-end tests of what operators must not do twice: change a key
// that changed since they looked at it.

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemadmin"
)

// idemCmd runs the binary with env added to the environment (IDEM_ADMIN_*
// cleared first) and returns its output and exit code.
func idemCmd(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(append(os.Environ(), "IDEM_ADMIN_TOKEN=", "IDEM_ADMIN_URL="), env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("idem %v: %v", args, err)
	}
	return string(out), 0
}

// getItem reads one key with idem keys get --json.
func getItem(t *testing.T, admin []string, id string) idemadmin.Item {
	t.Helper()
	out, code := idemCmd(t, nil, append([]string{"keys", "get", id, "--json"}, admin...)...)
	var it idemadmin.Item
	if code != 0 || json.Unmarshal([]byte(out), &it) != nil || it.Attempt == "" {
		t.Fatalf("keys get %s: exit %d\n%s", id, code, out)
	}
	return it
}

// TestCommandsChangeWhatWasSeen: two operators with the commands. One
// deletes an answer and the client's next request runs and stores a new
// one; the other's delete of the answer they looked at fails and leaves
// the new one. The same for a key settled and sent to review again.
func TestCommandsChangeWhatWasSeen(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	tf := tokenFile(t)
	p := startProxy(t, "--upstream", up.URL, "--store", "memory://", "--admin", "127.0.0.1:0", "--admin-token-file", tf)
	base := "http://" + p.addr
	admin := []string{"--admin-url", "http://" + p.admin, "--admin-token-file", tf}
	want(t, "the first run", do(t, "POST", base+"/pay", "order-1", `{}`).status, 201)
	var page idemadmin.Page
	if a := adminCall(t, p, "GET", "/api/v1/keys?state=completed", adminToken, ""); a.status != 200 || json.Unmarshal([]byte(a.body), &page) != nil || len(page.Items) != 1 {
		t.Fatalf("the completed key: %d %s", a.status, a.body)
	}
	id := page.Items[0].ID
	seen := getItem(t, admin, id).Attempt
	if out, _ := idemCmd(t, nil, append([]string{"keys", "list", "--state", "completed"}, admin...)...); !strings.Contains(out, "ATTEMPT") || !strings.Contains(out, seen) {
		t.Errorf("keys list does not show the attempt %s:\n%s", seen, out)
	}

	// Without --attempt nothing is deleted; the error names the attempt.
	out, code := idemCmd(t, nil, append([]string{"keys", "delete", id}, admin...)...)
	if code != 2 || !strings.Contains(out, "--attempt "+seen) || !strings.Contains(out, "--any-attempt") {
		t.Fatalf("keys delete without --attempt: exit %d\n%s", code, out)
	}
	if out, code = idemCmd(t, nil, append([]string{"keys", "delete", id, "--attempt", seen, "--any-attempt"}, admin...)...); code != 2 {
		t.Fatalf("keys delete with --attempt and --any-attempt: exit %d\n%s", code, out)
	}
	want(t, "runs before any delete", up.runs("/pay"), 1)

	if out, code = idemCmd(t, nil, append([]string{"keys", "delete", id, "--attempt", seen, "--note", "first operator"}, admin...)...); code != 0 {
		t.Fatalf("the first operator's delete: exit %d\n%s", code, out)
	}
	want(t, "the next request runs", do(t, "POST", base+"/pay", "order-1", `{}`).status, 201)
	out, code = idemCmd(t, nil, append([]string{"keys", "delete", id, "--attempt", seen, "--note", "second operator"}, admin...)...)
	if code != 1 || !strings.Contains(out, "another answer") {
		t.Fatalf("the second operator's delete of the answer they saw: exit %d\n%s", code, out)
	}
	r := do(t, "POST", base+"/pay", "order-1", `{}`)
	want(t, "the new answer replays", r.header.Get("Idempotent-Replayed"), "true")
	want(t, "runs", up.runs("/pay"), 2)
	if out, code = idemCmd(t, nil, append([]string{"keys", "delete", id, "--any-attempt"}, admin...)...); code != 0 {
		t.Fatalf("keys delete --any-attempt: exit %d\n%s", code, out)
	}

	// A key in review: released by one operator, retried, in review
	// again; the other's completion of the attempt they checked fails.
	want(t, "a reset", do(t, "POST", base+"/reset", "order-2", `{}`).status, 502)
	rid := reviewList(t, p)[0].ID
	checked := getItem(t, admin, rid).Attempt
	if out, code = idemCmd(t, nil, append([]string{"review", "resolve", rid, "--release", "--attempt", checked}, admin...)...); code != 0 {
		t.Fatalf("the first operator's release: exit %d\n%s", code, out)
	}
	want(t, "the retry resets again", do(t, "POST", base+"/reset", "order-2", `{}`).status, 502)
	out, code = idemCmd(t, nil, append([]string{"review", "resolve", rid, "--status", "201", "--body", "charged", "--attempt", checked}, admin...)...)
	if code != 1 || !strings.Contains(out, "went to review again") {
		t.Fatalf("the second operator's completion of the attempt they checked: exit %d\n%s", code, out)
	}
	if out, code = idemCmd(t, nil, append([]string{"review", "resolve", rid, "--release"}, admin...)...); code != 2 || strings.Contains(out, checked) {
		t.Fatalf("review resolve without --attempt: exit %d\n%s", code, out)
	}
	want(t, "still in review", do(t, "POST", base+"/reset", "order-2", `{}`).status, 409)
	want(t, "reset runs", up.runs("/reset"), 2)
}
