package main

// The checkout page in a real headless Chromium (Debian's chromium
// package, driven by chromedp): a double click on "Buy", and a connection
// that drops after the shop committed, are each one order and one charge.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/browsertest"
)

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

// checkout opens the shop in a new tab of browser, buys with click, runs
// during (if set), and waits until the checkout ends. It fails the test
// unless the page shows the order paid, and the shop holds one order and
// the provider one charge. It returns the checkout's key, as the page
// shows it, and how many requests the page sent.
func checkout(t *testing.T, browser context.Context, ts *testShop, click func(ctx context.Context) error, during func()) (key string, tries int) {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(ts.srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("buy"))); err != nil {
		t.Fatal(err)
	}
	if err := click(ctx); err != nil {
		t.Fatalf("clicking Buy: %v", err)
	}
	if during != nil {
		during()
	}
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.body.dataset.busy === '0'`)); err != nil {
		t.Fatalf("the checkout never finished: %v", err)
	}
	page, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`(id => [id('result').textContent, id('result').className, id('key').textContent, document.body.dataset.tries])(x => document.getElementById(x))`))
	if err != nil || len(page) != 4 {
		t.Fatalf("reading the page: %q, %v", page, err)
	}
	shown, cls, key := page[0], page[1], page[2]
	tries, _ = strconv.Atoi(page[3])
	ch := ts.charges()
	if cls != "ok" || len(ch) != 1 || !strings.Contains(shown, "is paid") || !strings.Contains(shown, ch[0].ID) {
		t.Fatalf("the page shows %q (%s); charges %v", shown, cls, ch)
	}
	if n := ts.count(`SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders", n)
	}
	return key, tries
}

func TestCheckoutPageInChromium(t *testing.T) {
	t.Parallel()
	browser := browsertest.New(t)

	// Double-clicking "Buy" sends the checkout twice, with one key. The
	// provider holds the first payment until the second has been told it
	// is in flight: the page waits as Retry-After says and asks again.
	// One order, one charge, and the page shows it paid.
	t.Run("double-click", func(t *testing.T) {
		d := &dropper{dropped: map[string]bool{}, keys: map[string][]string{}}
		ts := newTestShop(t, onSQLite, d.around)
		hanging := make(chan struct{}, 1)
		ts.prov.mu.Lock()
		ts.prov.hanging = func() { hanging <- struct{}{} }
		ts.prov.mu.Unlock()
		ts.prov.setNextFault(faultTimeout)
		key, tries := checkout(t, browser, ts, func(ctx context.Context) error {
			// A double click as a mouse makes it: press and release,
			// then press and release again with a click count of 2; the
			// page gets two clicks (and a dblclick).
			at, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(r => [r.x + r.width / 2, r.y + r.height / 2])(document.getElementById('buy').getBoundingClientRect())`))
			if err != nil {
				return err
			}
			return chromedp.Do(ctx, chromedp.MouseClickXY(at[0], at[1], chromedp.ClickCount(1)), chromedp.MouseClickXY(at[0], at[1], chromedp.ClickCount(2)))
		}, func() {
			select {
			case <-hanging: // the first payment reached the provider
			case <-time.After(time.Minute):
				t.Fatal("no payment reached the provider")
			}
			ts.waitOutcome(opPay, "in_flight")
			ts.prov.resume <- struct{}{}
		})
		if tries < 5 { // two orders, two payments, and the retry of the one in flight
			t.Fatalf("the page sent %d requests", tries)
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
		key, tries := checkout(t, browser, ts, func(ctx context.Context) error {
			return chromedp.Do(ctx, chromedp.Click(chromedp.ID("buy")))
		}, nil)
		// The shop saw the order twice and the payment twice (below). The
		// page resent each, unless Chromium resent one itself first (it
		// may, when a connection closes before any byte of the answer),
		// so the page counts two to four requests, never more.
		if tries < 2 || tries > 4 {
			t.Fatalf("the page sent %d requests", tries)
		}
		for _, path := range []string{"/orders", "/orders/1/pay"} {
			if keys := d.keysFor(path); len(keys) != 2 || keys[0] != key || keys[1] != key {
				t.Fatalf("POST %s came with keys %q; the page's key is %q", path, keys, key)
			}
		}
	})
}
