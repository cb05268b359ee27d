package idemadmin_test

// The review page in a real headless Chromium (Debian's chromium, driven
// by chromedp), at a desktop's 1280 px and a phone's 390 px: the
// overview, search, a bulk release, a bulk completion where one key
// changed underneath, and the page refreshing on its own while the
// operator types and ticks.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/internal/browsertest"
)

type chrome struct {
	t     *testing.T
	ctx   context.Context
	w, h  int64
	shots string
}

func (c *chrome) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	if err := chromedp.Do(c.ctx, actions...); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

func (c *chrome) text(sel string) string {
	c.t.Helper()
	s, err := chromedp.Run(c.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		c.t.Fatalf("reading %s: %v", sel, err)
	}
	return s
}

func (c *chrome) eval(expr string) bool {
	c.t.Helper()
	ok, err := chromedp.Run(c.ctx, chromedp.Evaluate[bool](expr))
	if err != nil {
		c.t.Fatalf("%s: %v", expr, err)
	}
	return ok
}

// until waits, bounded, for a condition the page reaches on its own time
// (its refresh).
func (c *chrome) until(what, expr string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](expr)); err != nil {
		c.t.Fatalf("%s never happened: %v", what, err)
	}
}

func (c *chrome) contains(what, sel string, want ...string) {
	c.t.Helper()
	got := strings.Join(strings.Fields(c.text(sel)), " ")
	for _, s := range want {
		if !strings.Contains(got, s) {
			c.t.Errorf("%s lacks %q:\n%s", what, s, got)
		}
	}
}

func (c *chrome) shot(name string) {
	c.t.Helper()
	if c.shots == "" {
		return
	}
	png, err := chromedp.Run(c.ctx, chromedp.FullScreenshot(90))
	if err != nil {
		c.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(c.shots, fmt.Sprintf("%s-%d.png", name, c.w))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// tick ticks the box of k in the queue.
func (c *chrome) tick(f *fixture, k idem.Key) {
	c.t.Helper()
	c.do("ticking "+k.Key, chromedp.Click(chromedp.CSS(fmt.Sprintf(`input[name="k"][value=%q]`, f.selection(k)))))
}

// fits checks what a width must show: at a phone's, nothing wider than
// the screen; at a desktop's, each request on one line.
func (c *chrome) fits(what string) {
	c.t.Helper()
	if !c.eval(`document.documentElement.scrollWidth <= window.innerWidth`) {
		c.t.Errorf("%s at %d px is wider than the window", what, c.w)
	}
	if c.w >= 1280 && !c.eval(`[...document.querySelectorAll("td.req code")].every(e => e.getClientRects().length === 1 && e.getBoundingClientRect().height < 2 * parseFloat(getComputedStyle(e).lineHeight))`) {
		c.t.Errorf("%s at %d px wraps a request", what, c.w)
	}
}

func TestPageInChromium(t *testing.T) {
	for _, size := range [][2]int64{{1280, 900}, {390, 844}} {
		t.Run(strconv.FormatInt(size[0], 10), func(t *testing.T) {
			pageInChromium(t, size[0], size[1])
		})
	}
}

func pageInChromium(t *testing.T, width, height int64) {
	f := newFixture(t, func(c *idemadmin.Config) { c.RefreshEvery = time.Second })
	c := &chrome{t: t, ctx: browsertest.New(t, chromedp.WindowSize(int(width), int(height))), w: width, h: height, shots: os.Getenv("IDEM_SCREENSHOT_DIR")}
	c.do("the viewport", chromedp.EmulateViewport(width, height))
	// The keys: one value in two scopes, keys to release and to complete
	// in bulk, one of another operation.
	f.review(idem.Key{Scope: "tenant-1", Operation: "POST /payments", Key: "order-1001"})
	f.complete(idem.Key{Scope: "tenant-2", Operation: "POST /payments", Key: "order-1001"})
	rel := []idem.Key{key("rel-1"), key("rel-2")}
	com := []idem.Key{key("com-a"), key("com-changed"), key("com-b")}
	for _, k := range append(append([]idem.Key{}, rel...), com...) {
		f.review(k)
	}
	f.begin(key("in-flight"), nil)
	refund := idem.Key{Scope: "tenant-9", Operation: "POST /refunds", Key: "refund-10"}
	f.review(refund)

	// Sign in with the keyboard.
	c.do("opening the page", chromedp.Navigate(f.srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.Focus(chromedp.ID("token")), chromedp.KeyEvent(opsToken), chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS(".tiles")))

	// The overview.
	c.contains("the overview", ".overview", "7 need review", "1 in flight", "1 completed", "the oldest in review", "order-1001",
		"Open keys by operation", "POST /refunds", "Recent actions", "None since this server started")
	c.contains("the status line", "#live-status", "refreshes every 1 s")
	c.fits("the overview")
	c.shot("overview")

	// Search: one value, found in both scopes and states.
	c.do("searching", chromedp.SendKeys(chromedp.ID("find"), "order-1001"), chromedp.Click(`//form[@role="search"]//button[@type="submit"]`),
		chromedp.WaitVisible(`//span[contains(., "Search results")]`))
	c.contains("the search", "main", "tenant-1", "tenant-2", "completed", "order-1001~")
	c.fits("the search")
	c.shot("search")

	// Bulk release: tick two keys, read the confirmation, confirm.
	c.do("the queue", chromedp.Navigate(f.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("table.keys")))
	for _, k := range rel {
		c.tick(f, k)
	}
	c.contains("the count", "[data-selected]", "2 keys selected")
	c.do("asking to release", chromedp.Click(`//button[contains(., "Release selected…")]`), chromedp.WaitVisible(chromedp.CSS(".confirm")))
	c.contains("the confirmation", "main", "release these 2 keys?", "rel-1", "rel-2", "POST /payments?currency=eur")
	if strings.Contains(c.text("main"), "com-a") {
		t.Error("the confirmation lists a key not ticked")
	}
	c.fits("the bulk confirmation")
	c.shot("bulk-release-confirm")
	c.do("confirming", chromedp.SendKeys(chromedp.ID("bulk-note"), "provider has none"),
		chromedp.Click(`//button[contains(., "Release 2 keys")]`), chromedp.WaitVisible(`//h1[contains(., "Released 2 of 2 keys")]`))
	for _, k := range rel {
		if got := f.retry(k).Outcome; got != idem.Acquired {
			t.Errorf("%s after the bulk release: %v", k.Key, got)
		}
	}

	// Bulk complete, one key changed underneath.
	c.do("the queue", chromedp.Navigate(f.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("table.keys")))
	for _, k := range com {
		c.tick(f, k)
	}
	c.do("asking to complete", chromedp.Click(`//button[contains(., "Complete selected…")]`), chromedp.WaitVisible(chromedp.ID("status")),
		chromedp.SendKeys(chromedp.ID("status"), "201"), chromedp.SendKeys(chromedp.ID("body"), `{"charged":true}`),
		chromedp.Click(`//button[contains(., "Review the answer…")]`), chromedp.WaitVisible(`//h2[contains(., "The answer every retry will get")]`))
	c.contains("the confirmation", "main", "com-a", "com-changed", "com-b", `{"charged":true}`)
	c.shot("bulk-complete-confirm")
	// Meanwhile another operator releases com-changed and its retry goes
	// to review again.
	wantStatus(t, "release", f.api("POST", "/api/v1/keys/"+idemadmin.KeyID(key("com-changed"))+"/resolve", aliceToken, `{"action":"release","attempt":"*"}`), 200)
	f.review(key("com-changed"))
	c.do("confirming", chromedp.Click(`//button[contains(., "Complete 3 keys")]`), chromedp.WaitVisible(`//h1[contains(., "Completed 2 of 3 keys")]`))
	c.contains("the result", "main", "1 key was skipped", "skipped: stale_attempt", "com-changed")
	c.fits("the bulk result")
	c.shot("bulk-complete-result")
	f.replays(key("com-a"), `{"charged":true}`)
	if got := f.retry(key("com-changed")).Outcome; got != idem.NeedsReview {
		t.Fatalf("the key that changed is %v, want needs_review", got)
	}

	// The page refreshes on its own and keeps what the operator types and
	// ticks: the overview updates, the list waits until nothing in it is
	// in progress.
	c.do("the queue", chromedp.Navigate(f.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("table.keys")))
	c.until("the first load", `document.getElementById("live-status").textContent.includes("Loaded at")`)
	before := c.text(".tiles .n")
	c.tick(f, refund)
	c.do("typing", chromedp.Click(chromedp.ID("find")), chromedp.SendKeys(chromedp.ID("find"), "half-typ"))
	f.review(key("arrived-later"))
	n, _ := strconv.Atoi(before)
	c.until("the overview's refresh", fmt.Sprintf(`document.querySelector(".tiles .n").textContent === "%d"`, n+1))
	c.until("the status line", `document.getElementById("live-status").textContent.includes("Updated at")`)
	if !c.eval(`document.getElementById("find").value === "half-typ" && document.activeElement.id === "find"`) {
		t.Error("the refresh lost what was typed, or the focus")
	}
	if !c.eval(fmt.Sprintf(`document.querySelector('input[name="k"][value=%q]').checked`, f.selection(refund))) {
		t.Error("the refresh lost the ticked box")
	}
	if strings.Contains(c.text("[data-live=queue]"), "arrived-later") {
		t.Error("the list was replaced while a box in it was ticked")
	}
	c.shot("refresh-kept")
	// Untick and leave the field: the list catches up.
	c.tick(f, refund)
	c.eval(`document.activeElement.blur(), true`)
	c.until("the list's refresh", `document.querySelector("[data-live=queue]").textContent.includes("arrived-later")`)
	if !c.eval(`document.getElementById("find").value === "half-typ"`) {
		t.Error("the search field lost its text")
	}
}
