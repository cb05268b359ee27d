package main_test

// End-to-end tests of the first sign-in: the page, the API and the
// commands accept what the docs tell an operator to paste.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idem-dev/idem/internal/browsertest"
)

// TestSignInPastingTheTokenFileLine: a newcomer follows the page, copies a
// whole line of the token file (with its CRLF, as an editor on Windows
// leaves it) and pastes it into the sign-in field of a real Chromium.
func TestSignInPastingTheTokenFileLine(t *testing.T) {
	t.Parallel()
	ctx := browsertest.New(t)
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", "memory://", "--admin", "127.0.0.1:0", "--admin-token-file", tokenFile(t))
	admin := "http://" + p.admin

	step(t, ctx, "opening the page", chromedp.Navigate(admin+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	if login := text(t, ctx, "main"); !strings.Contains(login, "a whole line of its --admin-token-file, NAME:TOKEN") {
		t.Errorf("the sign-in page does not say what to paste:\n%s", login)
	}
	focused(t, ctx, "the token field", "document.activeElement.id === 'token'")
	// Inserted as a paste is, through the field's editor, which keeps a
	// single-line field to one line.
	paste := chromedp.Evaluate[bool](`document.execCommand("insertText", false, ` + strconv.Quote("ops:"+adminToken+"\r\n") + `)`)
	if ok, err := chromedp.Run(ctx, paste); err != nil || !ok {
		t.Fatalf("pasting into the field: %v, %v", ok, err)
	}
	step(t, ctx, "signing in", chromedp.Click(`//button[contains(., "Sign in")]`), chromedp.WaitVisible(chromedp.CSS(".who")))
	if who := text(t, ctx, "body"); !strings.Contains(who, "Signed in as ops") {
		t.Fatalf("after pasting the line:\n%s", who)
	}
	eventually(t, "the sign-in line", func() bool { return strings.Contains(p.log(), `msg="admin: signed in" by=ops`) })
	if strings.Contains(p.log(), adminToken) {
		t.Fatalf("the log holds the token:\n%s", p.log())
	}
}

// colonToken holds colons: the token file must give it with its name.
const colonToken = "col:on-token-0123456789abcdef"

// TestAdminTokenAsTheDocsSay: the API and the commands accept a token
// alone or a whole line of the token file, as copied (CRLF, a byte order
// mark), and act under that line's name; a token under another name is
// refused.
func TestAdminTokenAsTheDocsSay(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	dir := t.TempDir()
	serverFile := filepath.Join(dir, "admin.tokens")
	if err := os.WriteFile(serverFile, []byte("ops:"+adminToken+"\r\nsvc:"+colonToken+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, "--upstream", up.URL, "--store", "memory://", "--admin", "127.0.0.1:0", "--admin-token-file", serverFile)
	for _, tc := range []struct {
		bearer string
		status int
	}{
		{adminToken, 200},
		{"ops:" + adminToken, 200},
		{"svc:" + colonToken, 200},
		{colonToken, 200},
		{"svc:" + adminToken, 401},
		{"ops", 401},
		{"col:" + colonToken, 401},
	} {
		want(t, "the API with Bearer "+tc.bearer[:min(4, len(tc.bearer))]+"…", adminCall(t, p, "GET", "/api/v1/keys", tc.bearer, "").status, tc.status)
	}

	url := "IDEM_ADMIN_URL=http://" + p.admin
	for _, env := range []string{"ops:" + adminToken, adminToken, "svc:" + colonToken, colonToken, " ops:" + adminToken + "\r\n"} {
		if out, code := idemCmd(t, []string{url, "IDEM_ADMIN_TOKEN=" + env}, "review", "list"); code != 0 {
			t.Errorf("review list with IDEM_ADMIN_TOKEN=%q: exit %d\n%s", env, code, out)
		}
	}
	for name, text := range map[string]string{
		"bom-crlf":  "\ufeffops:" + adminToken + "\r\n",
		"comments":  "# mine\n\nsvc:" + colonToken + "\n",
		"bare":      colonToken + "\n",
		"the whole": "", // the proxy's own file, two tokens
	} {
		path := serverFile
		if text != "" {
			path = filepath.Join(dir, name)
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		out, code := idemCmd(t, []string{url}, "review", "list", "--admin-token-file", path)
		switch {
		case text == "" && (code != 2 || !strings.Contains(out, "2 tokens found")):
			t.Errorf("review list with the proxy's file of two tokens: exit %d\n%s", code, out)
		case text != "" && code != 0:
			t.Errorf("review list with a file %q: exit %d\n%s", text, code, out)
		}
	}
	for _, tok := range []string{adminToken, colonToken} {
		if strings.Contains(p.log(), tok) {
			t.Fatalf("the proxy's log holds a token:\n%s", p.log())
		}
	}
}
