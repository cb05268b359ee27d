package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// Bad input is refused with a problem document, before anything runs.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	ts := newTestShop(t, onSQLite)
	c := ts.visitor()
	o := c.post("/orders", "order", `{"sku":"mug","qty":1}`)
	want(t, "the order", o, http.StatusCreated, "")

	req := func(path, key, ctype, body string, cookie *http.Cookie) *http.Request {
		r, _ := http.NewRequest(http.MethodPost, ts.srv.URL+path, strings.NewReader(body))
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		if key != "" {
			r.Header.Set(idem.HeaderName, key)
		}
		if cookie != nil {
			r.AddCookie(cookie)
		}
		return r
	}
	anon := &shopClient{ts: ts, hc: &http.Client{}}
	for _, tc := range []struct {
		name    string
		c       *shopClient
		r       *http.Request
		status  int
		problem string
	}{
		{"no session", anon, req("/orders", "k1", "application/json", `{"sku":"mug","qty":1}`, nil), 401, "scope-missing"},
		{"a forged session", anon, req("/orders", "k1", "application/json", `{"sku":"mug","qty":1}`,
			&http.Cookie{Name: sessionCookie, Value: c.user + ".forged"}), 401, "scope-denied"},
		{"another user's ID, unsigned", anon, req("/orders", "k1", "application/json", `{"sku":"mug","qty":1}`,
			&http.Cookie{Name: sessionCookie, Value: c.user}), 401, "scope-denied"},
		{"no key", c, req("/orders", "", "application/json", `{"sku":"mug","qty":1}`, nil), 400, "missing-key"},
		{"a key too long", c, req("/orders", strings.Repeat("k", 256), "application/json", `{"sku":"mug","qty":1}`, nil), 400, "invalid-key"},
		{"a form, not JSON", c, req("/orders", "k2", "application/x-www-form-urlencoded", `sku=mug&qty=1`, nil), 415, "unsupported-media-type"},
		{"no content type", c, req("/orders", "k3", "", `{"sku":"mug","qty":1}`, nil), 415, "unsupported-media-type"},
		{"broken JSON", c, req("/orders", "k4", "application/json", `{"sku":`, nil), 400, "bad-request"},
		{"an unknown field", c, req("/orders", "k5", "application/json", `{"sku":"mug","qty":1,"price_cents":1}`, nil), 400, "bad-request"},
		{"two JSON values", c, req("/orders", "k6", "application/json", `{"sku":"mug","qty":1}{}`, nil), 400, "bad-request"},
		{"qty 0", c, req("/orders", "k7", "application/json", `{"sku":"mug","qty":0}`, nil), 400, "bad-request"},
		{"qty negative", c, req("/orders", "k8", "application/json", `{"sku":"mug","qty":-5}`, nil), 400, "bad-request"},
		{"qty too large", c, req("/orders", "k9", "application/json", `{"sku":"mug","qty":11}`, nil), 400, "bad-request"},
		{"qty overflowing", c, req("/orders", "k10", "application/json", `{"sku":"mug","qty":9223372036854775808}`, nil), 400, "bad-request"},
		{"an unknown product", c, req("/orders", "k11", "application/json", `{"sku":"yacht","qty":1}`, nil), 422, "unknown-product"},
		{"a body over 4 KiB", c, req("/orders", "k12", "application/json", `{"sku":"`+strings.Repeat("m", 5000)+`","qty":1}`, nil), 413, "body-too-large"},
		{"a pay body with data", c, req(payPath(o.order.ID), "k13", "application/json", `{"amount_cents":1}`, nil), 400, "bad-request"},
		{"an order ID that is not one", c, req("/orders/abc/pay", "k14", "", "", nil), 404, "order-not-found"},
		{"order 0", c, req("/orders/0/ship", "k15", "", "", nil), 404, "order-not-found"},
		{"an order that does not exist", c, req("/orders/999999/pay", "k16", "", "", nil), 404, "order-not-found"},
	} {
		a := tc.c.do(tc.r)
		if a.err != nil || a.status != tc.status || !strings.HasSuffix(a.problem.Type, "#"+tc.problem) {
			t.Errorf("%s: %d %s %v, want %d %s", tc.name, a.status, a.body, a.err, tc.status, tc.problem)
		}
	}
	if n, s, ch := ts.orders(c.user), ts.stock("mug"), len(ts.charges()); n != 1 || s != 99 || ch != 0 {
		t.Fatalf("after the bad requests: %d orders, %d mugs, %d charges", n, s, ch)
	}
	// GETs need a session too, and show only the user's orders.
	if a := anon.do(mustGet(t, ts.srv.URL+"/orders")); a.status != 401 || !strings.HasSuffix(a.problem.Type, "#scope-missing") {
		t.Errorf("GET /orders without a session: %d %s", a.status, a.body)
	}
	forged := mustGet(t, ts.srv.URL+"/orders")
	forged.AddCookie(&http.Cookie{Name: sessionCookie, Value: c.user + ".forged"})
	if a := anon.do(forged); a.status != 401 || !strings.HasSuffix(a.problem.Type, "#scope-denied") {
		t.Errorf("GET /orders with a forged session: %d %s", a.status, a.body)
	}
	other := ts.visitor()
	if a := other.do(mustGet(t, ts.srv.URL+"/orders/1")); a.status != 404 {
		t.Errorf("GET another user's order: %d %s", a.status, a.body)
	}
	if a := c.do(mustGet(t, ts.srv.URL+"/orders")); a.status != 200 || !strings.Contains(a.body, `"client_order_id":"order"`) {
		t.Errorf("GET /orders: %d %s", a.status, a.body)
	}
}

func mustGet(t *testing.T, url string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The page escapes what it shows and hands out a session once.
func TestPage(t *testing.T) {
	t.Parallel()
	ts := newTestShop(t, onSQLite)
	c := ts.visitor()
	a := c.do(mustGet(t, ts.srv.URL+"/"))
	if a.status != 200 || a.header.Get("Set-Cookie") != "" || a.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("second visit: %d, %v", a.status, a.header)
	}
	for _, s := range []string{"Idempotent mug", "€12.00", "crypto.randomUUID", c.user, "None yet."} {
		if !strings.Contains(a.body, s) {
			t.Errorf("the page lacks %q", s)
		}
	}
	// A client order ID is the client's string: it must come out escaped.
	want(t, "an order", c.post("/orders", `<script>alert(1)</script>`, `{"sku":"mug","qty":1}`), 201, "")
	if a := c.do(mustGet(t, ts.srv.URL+"/")); strings.Contains(a.body, "<script>alert") {
		t.Error("the page shows a client order ID unescaped")
	}
}
