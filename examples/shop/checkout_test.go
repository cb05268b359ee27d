package main

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

func payPath(id int64) string  { return fmt.Sprintf("/orders/%d/pay", id) }
func shipPath(id int64) string { return fmt.Sprintf("/orders/%d/ship", id) }

// A checkout retried with its key is one order and one charge; the retries
// get the first answers back.
func TestCheckoutRetriesReplay(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		first := c.post("/orders", "checkout-1", `{"sku":"mug","qty":2}`)
		want(t, "the order", first, http.StatusCreated, "acquired")
		if first.order.State != "pending" || first.order.AmountCents != 2400 || first.header.Get("Location") != fmt.Sprintf("/orders/%d", first.order.ID) {
			t.Fatalf("the order: %s %v", first.body, first.header)
		}
		// Member order and spacing do not make it another request.
		again := c.post("/orders", "checkout-1", `{ "qty": 2, "sku": "mug" }`)
		want(t, "its retry", again, http.StatusCreated, "replayed")
		if again.body != first.body {
			t.Fatalf("the retry got %s, the first %s", again.body, first.body)
		}
		paid := c.post(payPath(first.order.ID), "checkout-1", "")
		want(t, "the payment", paid, http.StatusOK, "acquired")
		repaid := c.post(payPath(first.order.ID), "checkout-1", `{}`) // another body: another request
		want(t, "the payment with another body", repaid, http.StatusUnprocessableEntity, "mismatch")
		repaid = c.post(payPath(first.order.ID), "checkout-1", "")
		want(t, "the payment's retry", repaid, http.StatusOK, "replayed")
		if paid.order.State != "paid" || paid.order.ChargeID == "" || repaid.body != paid.body {
			t.Fatalf("paid %s, retry %s", paid.body, repaid.body)
		}
		if n := len(ts.charges()); n != 1 {
			t.Fatalf("%d charges", n)
		}
		if n, s := ts.orders(c.user), ts.stock("mug"); n != 1 || s != 98 {
			t.Fatalf("%d orders, %d mugs left", n, s)
		}
	})
}

// Many copies of one checkout at once (a double click, an impatient
// retry): one runs, the others wait their turn or get its answer.
func TestDoubleSubmitRunsOnce(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		const copies = 8
		burst := func(path, body string) []answer {
			answers := make([]answer, copies)
			var wg sync.WaitGroup
			for i := range answers {
				wg.Go(func() { answers[i] = c.post(path, "double", body) })
			}
			wg.Wait()
			acquired := 0
			for _, a := range answers {
				switch {
				case a.err != nil:
					t.Fatal(a.err)
				case a.outcome() == "acquired":
					acquired++
				case a.outcome() == "replayed", a.outcome() == "in_flight" && a.status == http.StatusConflict:
				default:
					t.Fatalf("%s: %d %s %s", path, a.status, a.outcome(), a.body)
				}
			}
			if acquired != 1 {
				t.Fatalf("%s ran %d times", path, acquired)
			}
			return answers
		}
		var id int64
		for _, a := range burst("/orders", `{"sku":"tee","qty":1}`) {
			if a.outcome() == "acquired" {
				id = a.order.ID
			}
		}
		burst(payPath(id), "")
		if n, s, ch := ts.orders(c.user), ts.stock("tee"), len(ts.charges()); n != 1 || s != 49 || ch != 1 {
			t.Fatalf("%d orders, %d tees left, %d charges", n, s, ch)
		}
	})
}

// The unique constraint on (user, client order ID) is the safeguard behind
// the key: when idem's record is gone (its retention ended, or an operator
// deleted it), a retry still finds the order instead of placing another.
func TestUniqueConstraintWithoutTheKeysRecord(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		first := c.post("/orders", "k", `{"sku":"mug","qty":1}`)
		want(t, "the order", first, http.StatusCreated, "acquired")
		forget := func() {
			if err := ts.db.store().Delete(t.Context(), idemstore.DeleteParams{Key: keyOf(c.user, opCreate, "k")}); err != nil {
				t.Fatal(err)
			}
		}
		forget()
		again := c.post("/orders", "k", `{"sku":"mug","qty":1}`)
		want(t, "the retry without a record", again, http.StatusOK, "acquired")
		if again.order.ID != first.order.ID {
			t.Fatalf("the retry placed order %d; the first was %d", again.order.ID, first.order.ID)
		}
		forget()
		other := c.post("/orders", "k", `{"sku":"mug","qty":3}`)
		want(t, "another order under the same client order ID", other, http.StatusConflict, "client-order-id-reused")
		if n, s := ts.orders(c.user), ts.stock("mug"); n != 1 || s != 99 {
			t.Fatalf("%d orders, %d mugs left", n, s)
		}
	})
}

// Stock never goes below zero: the guarded update takes it only when
// there is enough, and the CHECK constraint stands behind it.
func TestStockNeverNegative(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		const buyers = 6 // two posters each; three in stock
		answers := make([]answer, buyers)
		var wg sync.WaitGroup
		for i := range answers {
			c := ts.visitor()
			wg.Go(func() { answers[i] = c.post("/orders", fmt.Sprint("poster-", i), `{"sku":"poster","qty":2}`) })
		}
		wg.Wait()
		placed := 0
		for _, a := range answers {
			switch {
			case a.status == http.StatusCreated:
				placed++
			case a.status == http.StatusConflict && a.problem.Type == problemBase+"out-of-stock":
			default:
				t.Fatalf("%d %s %v", a.status, a.body, a.err)
			}
		}
		if s := ts.stock("poster"); placed != 1 || s != 1 {
			t.Fatalf("%d orders placed, %d posters left", placed, s)
		}
		if _, err := ts.db.exec(t.Context(), `UPDATE products SET stock = stock - 2 WHERE sku = 'poster'`); err == nil {
			t.Fatal("the CHECK constraint let the stock go negative")
		}
	})
}
