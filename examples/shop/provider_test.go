package main

import (
	"net/http"
	"strings"
	"testing"
)

// The provider's double charges once per key, as the shop relies on.
func TestProviderChargesOncePerKey(t *testing.T) {
	t.Parallel()
	ts := newTestShop(t, onSQLite)
	post := func(key, body string) (int, string, http.Header) {
		req, _ := http.NewRequest(http.MethodPost, ts.provSrv.URL+"/v1/charges", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		a := (&shopClient{ts: ts, hc: ts.provSrv.Client()}).do(req)
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a.status, a.body, a.header
	}
	const charge = `{"order_id":1,"amount_cents":500,"currency":"EUR"}`
	st, first, _ := post("k", charge)
	if st != 201 || !strings.Contains(first, `"status":"succeeded"`) {
		t.Fatalf("first charge: %d %s", st, first)
	}
	st, again, h := post("k", charge)
	if st != 201 || again != first || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("same key: %d %s %v", st, again, h)
	}
	if st, body, _ := post("k", `{"order_id":1,"amount_cents":501,"currency":"EUR"}`); st != 422 {
		t.Fatalf("same key, another amount: %d %s", st, body)
	}
	if st, body, _ := post("", charge); st != 400 {
		t.Fatalf("no key: %d %s", st, body)
	}
	if n := len(ts.charges()); n != 1 {
		t.Fatalf("%d charges", n)
	}
	ch, found, err := ts.shop.payments.lookup(t.Context(), "k")
	if err != nil || !found || ch.AmountCents != 500 {
		t.Fatalf("lookup: %+v %v %v", ch, found, err)
	}
	if _, found, err := ts.shop.payments.lookup(t.Context(), "no such key/with a slash"); err != nil || found {
		t.Fatalf("lookup of a key never used: %v %v", found, err)
	}
	for _, bad := range []string{`{"next":"explode"}`, `nonsense`} {
		resp, err := ts.provSrv.Client().Post(ts.provSrv.URL+"/v1/faults", "application/json", strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("fault %s: %d", bad, resp.StatusCode)
		}
	}
}
