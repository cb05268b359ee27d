package main_test

// The review page in a real headless Chromium (Debian's chromium package,
// driven by chromedp): sign in, find a key that a reset upstream put in
// review, release it, and see the client's retry run.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/idem-dev/idem/internal/browsertest"
)

// screenshotDir is where screenshots go: IDEM_SCREENSHOT_DIR, or the
// test's temporary directory.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("IDEM_SCREENSHOT_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err == nil {
			return d
		}
	}
	return t.TempDir()
}

func screenshot(t *testing.T, ctx context.Context, dir, name string, width, height int64) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height)); err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// step runs actions that return nothing, failing the test with what.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// focused waits until the element the page focuses on load (autofocus)
// has the focus: what a keyboard user types goes there.
func focused(t *testing.T, ctx context.Context, what, predicate string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(wctx, chromedp.Poll[chromedp.Void](predicate)); err != nil {
		t.Fatalf("%s never had the focus: %v", what, err)
	}
}

// text returns the text of the element sel selects.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("reading %s: %v", sel, err)
	}
	return s
}

func TestReviewPageInChromium(t *testing.T) {
	t.Parallel()
	ctx := browsertest.New(t, chromedp.WindowSize(1280, 900))
	up := newUpstream(t)
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--admin", "127.0.0.1:0",
		"--admin-token-file", tokenFile(t), "--store-request")
	base, admin := "http://"+p.addr, "http://"+p.admin
	want(t, "a reset upstream", do(t, "POST", base+"/reset?currency=eur", "order-42", `{"amount":4200}`).status, 502)
	want(t, "another", do(t, "POST", base+"/reset", "order-43", `{"amount":1}`).status, 502)
	want(t, "upstream runs", up.runs("/reset"), 2)
	dir := screenshotDir(t)

	// Without a session the page asks for the token.
	step(t, ctx, "opening the page", chromedp.Navigate(admin+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || !strings.HasSuffix(loc, "/login") {
		t.Fatalf("the page without a session is at %s, %v", loc, err)
	}
	screenshot(t, ctx, dir, "review-login", 1280, 720)

	// Sign in with the keyboard: the token field has the focus, Enter
	// submits.
	focused(t, ctx, "the token field", "document.activeElement.id === 'token'")
	step(t, ctx, "signing in", chromedp.KeyEvent(adminToken), chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS("table.keys")))
	queue := text(t, ctx, "body")
	for _, s := range []string{"order-42", "order-43", "POST /reset?currency=eur", "upstream failed", "Signed in as ops"} {
		if !strings.Contains(queue, s) {
			t.Errorf("the queue lacks %q:\n%s", s, queue)
		}
	}
	screenshot(t, ctx, dir, "review-queue-desktop", 1280, 720)
	screenshot(t, ctx, dir, "review-queue-phone", 390, 844)

	// Open the key.
	step(t, ctx, "opening the key", chromedp.EmulateViewport(1280, 900),
		chromedp.Click(`//a[@class="key"][contains(., "order-42")]`), chromedp.WaitVisible(chromedp.ID("release-note")))
	detail := text(t, ctx, "main")
	for _, s := range []string{"order-42", `"amount": 4200`, "needs_review", "It did not happen", "It happened"} { // the JSON body, indented
		if !strings.Contains(detail, s) {
			t.Errorf("the detail lacks %q:\n%s", s, detail)
		}
	}
	screenshot(t, ctx, dir, "review-detail-desktop", 1280, 900)
	screenshot(t, ctx, dir, "review-detail-phone", 390, 844)

	// Release it, behind the confirmation.
	step(t, ctx, "asking to release", chromedp.EmulateViewport(1280, 900),
		chromedp.SendKeys(chromedp.ID("release-note"), "provider has no charge for order-42"),
		chromedp.Click(`//button[contains(., "Release…")]`), chromedp.WaitVisible(chromedp.CSS(".confirm")))
	if confirm := text(t, ctx, "main"); !strings.Contains(confirm, "release this key?") || !strings.Contains(confirm, "provider has no charge") {
		t.Errorf("the confirmation:\n%s", confirm)
	}
	want(t, "the retry before the confirmation", do(t, "POST", base+"/reset?currency=eur", "order-42", `{"amount":4200}`).status, 409)
	screenshot(t, ctx, dir, "review-confirm", 1280, 720)
	// The confirm button has the focus: Enter confirms.
	focused(t, ctx, "the confirm button", "document.activeElement.matches('.confirm button[type=submit]')")
	step(t, ctx, "confirming", chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS(".flash")))
	if after := text(t, ctx, "main"); !strings.Contains(after, `Released key "order-42"`) || strings.Contains(after, "order-42\t") {
		t.Errorf("after the release:\n%s", after)
	}
	screenshot(t, ctx, dir, "review-released", 1280, 720)

	// The client's retry runs: it is forwarded to the upstream again.
	want(t, "the retry after the release", do(t, "POST", base+"/reset?currency=eur", "order-42", `{"amount":4200}`).status, 502)
	want(t, "upstream runs after the retry", up.runs("/reset"), 3)
	eventually(t, "the audit line", func() bool { return strings.Contains(p.log(), `msg="admin: key resolved" by=ops action=release`) })

	// Signing out ends the session: the page asks for the token again.
	step(t, ctx, "signing out", chromedp.Click(`//button[contains(., "Sign out")]`), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.Navigate(admin+"/"), chromedp.WaitVisible(chromedp.ID("token")))
}
