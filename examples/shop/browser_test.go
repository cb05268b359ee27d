package main

// The checkout page in a real headless Chromium (Debian's chromium
// package, driven by chromedp): a double click on "Buy", and a connection
// that drops after the shop committed, are each one order and one charge.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-dev/idem"
)

// chromiumPath finds Debian's chromium; without it the test skips, or
// fails when CI=true (scripts/services.sh installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("IDEM_TEST_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed and CI=true; run scripts/services.sh (it installs Debian's chromium)")
	}
	t.Skip("chromium is not installed; run scripts/services.sh (it installs Debian's chromium) to test the checkout page in a browser")
	return ""
}

// newBrowser starts a headless Chromium with a fresh profile and nothing
// that reaches the network on its own.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// dropper serves the shop and records the Idempotency-Key of every POST.
// With drop set, for the first POST to each path it runs the shop's
// handler to the end (the order or the payment committed) and then drops
// the connection without an answer: a reply lost on its way back.
type dropper struct {
	next http.Handler
	drop bool

	mu      sync.Mutex
	dropped map[string]bool
	keys    map[string][]string // path → keys, in arrival order
}

func (d *dropper) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		d.next.ServeHTTP(w, r)
		return
	}
	d.mu.Lock()
	d.keys[r.URL.Path] = append(d.keys[r.URL.Path], r.Header.Get(idem.HeaderName))
	drop := d.drop && !d.dropped[r.URL.Path]
	d.dropped[r.URL.Path] = true
	d.mu.Unlock()
	if !drop {
		d.next.ServeHTTP(w, r)
		return
	}
	d.next.ServeHTTP(httptest.NewRecorder(), r) // runs and commits; the answer goes nowhere
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// around makes d the test shop's server handler, around the shop's.
func (d *dropper) around(ts *testShop) {
	ts.wrap = func(h http.Handler) http.Handler {
		d.next = h
		return d
	}
}

func (d *dropper) keysFor(path string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.keys[path]...)
}

// checkoutDone waits until the page shows the paid order and returns what
// it shows.
func checkoutDone(t *testing.T, ctx context.Context) string {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#result.ok"))); err != nil {
		t.Fatalf("the checkout never finished: %v", err)
	}
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#result")))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCheckoutPageInChromium(t *testing.T) {
	t.Parallel()
	browser := newBrowser(t)

	// Double-clicking "Buy" sends the checkout twice, with one key: one
	// order, one charge, and the page shows it paid.
	t.Run("double-click", func(t *testing.T) {
		d := &dropper{dropped: map[string]bool{}, keys: map[string][]string{}}
		ts := newTestShop(t, onSQLite, d.around)
		ctx, cancel := chromedp.NewContext(browser)
		defer cancel()
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("buy"))); err != nil {
			t.Fatal(err)
		}
		// A double click as a mouse makes it: press and release, then
		// press and release again with a click count of 2; the page gets
		// two clicks (and a dblclick).
		at, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(r => [r.x + r.width / 2, r.y + r.height / 2])(document.getElementById('buy').getBoundingClientRect())`))
		if err != nil {
			t.Fatal(err)
		}
		if err := chromedp.Do(ctx, chromedp.MouseClickXY(at[0], at[1], chromedp.ClickCount(1)), chromedp.MouseClickXY(at[0], at[1], chromedp.ClickCount(2))); err != nil {
			t.Fatal(err)
		}
		shown := checkoutDone(t, ctx)
		key, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("key")))
		if err != nil {
			t.Fatal(err)
		}
		ch := ts.charges()
		if len(ch) != 1 || !strings.Contains(shown, "is paid") || !strings.Contains(shown, ch[0].ID) {
			t.Fatalf("the page shows %q; charges %v", shown, ch)
		}
		if n := ts.count(`SELECT count(*) FROM orders`); n != 1 {
			t.Fatalf("%d orders", n)
		}
		sent := d.keysFor("/orders")
		if len(sent) < 2 {
			t.Fatalf("POST /orders came %d times: the double click did not send the checkout twice", len(sent))
		}
		for _, k := range sent {
			if k != key {
				t.Fatalf("POST /orders came with keys %q; the page's key is %q", sent, key)
			}
		}
	})

	// The shop commits the order, and again the payment, but the
	// connection drops before the answer: the page sends the same
	// request again, with the same key, and gets the first answer.
	t.Run("dropped-connection", func(t *testing.T) {
		d := &dropper{drop: true, dropped: map[string]bool{}, keys: map[string][]string{}}
		ts := newTestShop(t, onSQLite, d.around)
		// Without keep-alive Chromium does not resend a request whose
		// connection dropped by itself: the page's own retry is tested.
		ts.srv.Config.SetKeepAlivesEnabled(false)
		ctx, cancel := chromedp.NewContext(browser)
		defer cancel()
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("buy")),
			chromedp.Click(chromedp.ID("buy"))); err != nil {
			t.Fatal(err)
		}
		shown := checkoutDone(t, ctx)
		key, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("key")))
		if err != nil {
			t.Fatal(err)
		}
		ch := ts.charges()
		if len(ch) != 1 || !strings.Contains(shown, "is paid") || !strings.Contains(shown, ch[0].ID) {
			t.Fatalf("the page shows %q; charges %v", shown, ch)
		}
		if n := ts.count(`SELECT count(*) FROM orders`); n != 1 {
			t.Fatalf("%d orders", n)
		}
		for _, path := range []string{"/orders", "/orders/1/pay"} {
			if keys := d.keysFor(path); len(keys) != 2 || keys[0] != key || keys[1] != key {
				t.Fatalf("POST %s came with keys %q; the page's key is %q", path, keys, key)
			}
		}
	})
}
