package main_test

// One sign-in for a fleet, in a real Chromium: two idem serve processes
// share one store and one token file, as two instances behind a load
// balancer do. An operator signs in on one, acts through the other, and
// signs out there; the first then asks for the token again.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/idem-dev/idem/internal/browsertest"
)

func TestFleetSignInInChromium(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	store, tf := sqliteStore(t), tokenFile(t)
	a := startProxy(t, "--upstream", up.URL, "--store", store, "--admin", "127.0.0.1:0", "--admin-token-file", tf, "--store-request")
	b := startProxy(t, "--upstream", up.URL, "--store", store, "--admin", "127.0.0.1:0", "--admin-token-file", tf, "--store-request")
	for _, size := range [][2]int64{{1280, 900}, {390, 844}} {
		w := size[0]
		keys := []string{fmt.Sprintf("w%d-order-1", w), fmt.Sprintf("w%d-order-2", w)}
		for _, k := range keys {
			want(t, "a reset upstream", do(t, "POST", "http://"+a.addr+"/reset?currency=eur", k, `{"amount":1}`).status, 502)
		}
		ctx := browsertest.New(t, chromedp.WindowSize(int(size[0]), int(size[1])))
		step(t, ctx, "the viewport", chromedp.EmulateViewport(size[0], size[1]))

		// Sign in on A.
		step(t, ctx, "signing in on A", chromedp.Navigate("http://"+a.admin+"/"), chromedp.WaitVisible(chromedp.ID("token")),
			chromedp.Focus(chromedp.ID("token")), chromedp.KeyEvent(adminToken), chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS(".who")))

		// B takes the session: no sign-in, and its page acts.
		step(t, ctx, "opening B", chromedp.Navigate("http://"+b.admin+"/"), chromedp.WaitVisible(chromedp.CSS("table.keys")))
		if got := text(t, ctx, "body"); !strings.Contains(got, "Signed in as ops") || !strings.Contains(got, keys[0]) {
			t.Fatalf("B at %d px:\n%s", w, got)
		}
		for _, k := range keys {
			step(t, ctx, "ticking "+k, chromedp.Click(fmt.Sprintf(`//tr[.//code[text()=%q]]//input[@name="k"]`, k)))
		}
		step(t, ctx, "releasing through B", chromedp.Click(`//button[contains(., "Release selected…")]`), chromedp.WaitVisible(chromedp.CSS(".confirm")),
			chromedp.Click(`//button[contains(., "Release 2 keys")]`), chromedp.WaitVisible(`//h1[contains(., "Released 2 of 2 keys")]`))
		for _, k := range keys {
			want(t, "the retry of "+k+" runs again", do(t, "POST", "http://"+a.addr+"/reset?currency=eur", k, `{"amount":1}`).status, 502)
		}
		eventually(t, "B's audit lines", func() bool {
			return strings.Contains(b.log(), `msg="admin: bulk action" by=ops action=release keys=2 settled=2`)
		})

		// Sign out on B; A asks for the token again.
		step(t, ctx, "signing out on B", chromedp.Click(`//button[contains(., "Sign out")]`), chromedp.WaitVisible(chromedp.ID("token")))
		step(t, ctx, "A after the sign-out", chromedp.Navigate("http://"+a.admin+"/"), chromedp.WaitVisible(chromedp.ID("token")))
		if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || !strings.HasSuffix(loc, "/login") {
			t.Fatalf("A after the sign-out on B is at %s, %v", loc, err)
		}
	}
}
