package main

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
)

// Transitions that arrive out of order, or twice, are refused or replayed;
// nothing moves backwards and nothing is charged twice.
func TestTransitionsOutOfOrder(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		o := c.post("/orders", "order", `{"sku":"mug","qty":1}`)
		want(t, "the order", o, http.StatusCreated, "")
		id := o.order.ID

		want(t, "ship before pay", c.post(shipPath(id), "ship-1", ""), http.StatusConflict, "transition-refused")
		want(t, "ship before pay, retried", c.post(shipPath(id), "ship-1", ""), http.StatusConflict, "replayed")
		paid := c.post(payPath(id), "pay-1", "")
		want(t, "pay", paid, http.StatusOK, "acquired")
		want(t, "pay again, another key", c.post(payPath(id), "pay-2", ""), http.StatusConflict, "transition-refused")
		shipped := c.post(shipPath(id), "ship-2", "")
		want(t, "ship", shipped, http.StatusOK, "acquired")
		if shipped.order.State != "shipped" || shipped.order.ChargeID != paid.order.ChargeID {
			t.Fatalf("shipped: %s", shipped.body)
		}
		want(t, "ship again, another key", c.post(shipPath(id), "ship-3", ""), http.StatusConflict, "transition-refused")
		// The first payment replayed after the order shipped: its own
		// answer, not a second charge, and the order stays shipped.
		late := c.post(payPath(id), "pay-1", "")
		want(t, "the first payment, replayed late", late, http.StatusOK, "replayed")
		if late.body != paid.body {
			t.Fatalf("replayed %s, first %s", late.body, paid.body)
		}
		want(t, "pay after shipping, another key", c.post(payPath(id), "pay-3", ""), http.StatusConflict, "transition-refused")
		if n := len(ts.charges()); n != 1 {
			t.Fatalf("%d charges", n)
		}
		if st := ts.count(`SELECT count(*) FROM orders WHERE id = ? AND state = 'shipped'`, id); st != 1 {
			t.Fatal("the order is no longer shipped")
		}
		// Another user cannot move it, nor see it.
		other := ts.visitor()
		want(t, "another user's ship", other.post(shipPath(id), "ship-4", ""), http.StatusNotFound, "order-not-found")
		want(t, "another user's pay", other.post(payPath(id), "pay-4", ""), http.StatusNotFound, "order-not-found")
	})
}

// Payments of one order under different keys at once (two tabs): the claim
// lets one attempt charge; the others are refused before they reach the
// provider.
func TestConcurrentPaymentsOfOneOrder(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		o := c.post("/orders", "order", `{"sku":"tee","qty":1}`)
		want(t, "the order", o, http.StatusCreated, "")
		const tabs = 6
		answers := make([]answer, tabs)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = c.post(payPath(o.order.ID), fmt.Sprint("tab-", i), "") })
		}
		wg.Wait()
		paid := 0
		for _, a := range answers {
			switch {
			case a.status == http.StatusOK:
				paid++
			case a.status == http.StatusConflict && (a.problem.Type == problemBase+"payment-in-progress" || a.problem.Type == problemBase+"transition-refused"):
			default:
				t.Fatalf("%d %s %v", a.status, a.body, a.err)
			}
		}
		if n := len(ts.charges()); paid != 1 || n != 1 {
			t.Fatalf("%d payments succeeded, %d charges", paid, n)
		}
	})
}
