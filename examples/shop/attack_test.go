package main

import (
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// Two users who happen to pick the same key at the same moment each get
// their own order: one user's key never replays another's order.
func TestSameKeyTwoUsersAtOnce(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		a, b := ts.visitor(), ts.visitor()
		var ra, rb answer
		var wg sync.WaitGroup
		wg.Go(func() { ra = a.post("/orders", "shared", `{"sku":"mug","qty":1}`) })
		wg.Go(func() { rb = b.post("/orders", "shared", `{"sku":"tee","qty":2}`) })
		wg.Wait()
		want(t, "a's order", ra, http.StatusCreated, "acquired")
		want(t, "b's order", rb, http.StatusCreated, "acquired")
		if ra.order.ID == rb.order.ID || ra.order.SKU != "mug" || rb.order.SKU != "tee" {
			t.Fatalf("a got %s, b got %s", ra.body, rb.body)
		}
		var pa, pb answer
		wg.Go(func() { pa = a.post(payPath(ra.order.ID), "shared", "") })
		wg.Go(func() { pb = b.post(payPath(rb.order.ID), "shared", "") })
		wg.Wait()
		want(t, "a pays", pa, http.StatusOK, "acquired")
		want(t, "b pays", pb, http.StatusOK, "acquired")
		chs := ts.charges()
		if len(chs) != 2 || chs[0].ID == chs[1].ID || pa.order.ChargeID == pb.order.ChargeID {
			t.Fatalf("charges %v; a %s, b %s", chs, pa.body, pb.body)
		}
		// b cannot see, pay or ship a's order, nor replay a's answer.
		want(t, "b pays a's order", b.post(payPath(ra.order.ID), "other", ""), http.StatusNotFound, "")
		want(t, "b ships a's order", b.post("/orders/"+itoa(ra.order.ID)+"/ship", "other2", ""), http.StatusNotFound, "")
		if n := len(ts.charges()); n != 2 {
			t.Fatalf("%d charges", n)
		}
	})
}

// The same client order ID with another body is refused (422), while
// idem still has its record, and places nothing.
func TestSameKeyOtherBody(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		want(t, "the order", c.post("/orders", "k", `{"sku":"mug","qty":1}`), http.StatusCreated, "acquired")
		want(t, "another body", c.post("/orders", "k", `{"sku":"mug","qty":2}`), http.StatusUnprocessableEntity, "mismatch")
		if n, s := ts.orders(c.user), ts.stock("mug"); n != 1 || s != 99 {
			t.Fatalf("%d orders, %d mugs left", n, s)
		}
	})
}

// One payment key used for two orders of one user: the second order is
// not paid with the first order's charge, with or without idem's record.
func TestOnePaymentKeyTwoOrders(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		o1 := c.post("/orders", "o1", `{"sku":"mug","qty":1}`)
		o2 := c.post("/orders", "o2", `{"sku":"mug","qty":1}`)
		want(t, "order 1", o1, http.StatusCreated, "acquired")
		want(t, "order 2", o2, http.StatusCreated, "acquired")
		want(t, "pay 1", c.post(payPath(o1.order.ID), "pay", ""), http.StatusOK, "acquired")
		second := c.post(payPath(o2.order.ID), "pay", "")
		if second.status == http.StatusOK && second.order.ID != o2.order.ID {
			t.Logf("pay 2 replayed order 1's answer: %d %s %s", second.status, second.outcome(), second.body)
		}
		if err := ts.db.store().Delete(t.Context(), idemstore.DeleteParams{Key: keyOf(c.user, opPay, "pay")}); err != nil {
			t.Fatal(err)
		}
		third := c.post(payPath(o2.order.ID), "pay", "")
		t.Logf("pay 2 without the record: %d %s %s", third.status, third.outcome(), third.body)
		var state string
		if err := ts.db.queryRow(t.Context(), `SELECT state FROM orders WHERE id = ?`, o2.order.ID).Scan(&state); err != nil {
			t.Fatal(err)
		}
		if state != "pending" || len(ts.charges()) != 1 {
			t.Fatalf("order 2 is %s with %d charges; second answer %d %s", state, len(ts.charges()), second.status, second.body)
		}
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A payment whose outcome is unknown holds its order: another key cannot
// charge it again before the resolver has asked the provider.
func TestOtherKeyWhileOutcomeUnknown(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		id := placeOrder(t, c)
		ts.prov.setNextFault(faultTimeout)
		want(t, "the payment", ts.payTimingOut(c, id, "pay"), http.StatusBadGateway, "payment-outcome-unknown")
		want(t, "another key before the resolver", c.post(payPath(id), "pay-2", ""), http.StatusConflict, "payment-in-progress")
		ts.recover()
		want(t, "another key after the resolver", c.post(payPath(id), "pay-3", ""), http.StatusConflict, "transition-refused")
		if n := len(ts.charges()); n != 1 {
			t.Fatalf("%d charges", n)
		}
	})
}
