package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// placeOrder places an order and returns its ID.
func placeOrder(t *testing.T, c *shopClient) int64 {
	t.Helper()
	a := c.post("/orders", "order", `{"sku":"tee","qty":1}`)
	want(t, "the order", a, http.StatusCreated, "acquired")
	return a.order.ID
}

// A provider that charged but gave no clear answer (a timeout, a 500): the
// key goes to review, retries wait, and the resolver asks the provider with
// the same key, finds the charge and settles the key with it.
func TestPaymentOutcomeUnknownSettledByResolver(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{faultTimeout, faultAfterCharge} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			onEach(t, func(t *testing.T, backend string) {
				ts := newTestShop(t, backend)
				c := ts.visitor()
				id := placeOrder(t, c)
				ts.prov.setNextFault(fault)
				var first answer
				if fault == faultTimeout {
					first = ts.payTimingOut(c, id, "pay")
				} else {
					first = c.post(payPath(id), "pay", "")
				}
				want(t, "the payment", first, http.StatusBadGateway, "payment-outcome-unknown")
				if n := len(ts.charges()); n != 1 {
					t.Fatalf("the provider has %d charges", n)
				}
				want(t, "a retry before the resolver", c.post(payPath(id), "pay", ""), http.StatusConflict, "needs_review")
				rec, err := ts.db.store().Get(t.Context(), keyOf(c.user, opPay, "pay"))
				if err != nil || rec.State != idemstore.StateNeedsReview {
					t.Fatalf("the key: %+v, %v", rec, err)
				}

				if rep := ts.recover(); rep.Completed != 1 || rep.Unknown != 0 {
					t.Fatalf("recovery: %+v", rep)
				}
				settled := c.post(payPath(id), "pay", "")
				want(t, "the retry after the resolver", settled, http.StatusOK, "replayed")
				if ch := ts.charges(); len(ch) != 1 || settled.order.State != "paid" || settled.order.ChargeID != ch[0].ID {
					t.Fatalf("settled %s; charges %v", settled.body, ch)
				}
				if rep := ts.recover(); rep != (idem.RecoverReport{}) {
					t.Fatalf("a second recovery did %+v", rep)
				}
			})
		})
	}
}

// payTimingOut pays order id while the provider, told to time out, hangs
// after charging; once it hangs, the test's clock passes the shop's
// provider timeout.
func (ts *testShop) payTimingOut(c *shopClient, id int64, key string) answer {
	hanging := make(chan struct{}, 1)
	ts.prov.mu.Lock()
	ts.prov.hanging = func() { hanging <- struct{}{} }
	ts.prov.mu.Unlock()
	res := make(chan answer, 1)
	go func() { res <- c.post(payPath(id), key, "") }()
	select {
	case <-hanging:
	case a := <-res:
		ts.t.Fatalf("the payment answered before the provider hung: %d %s", a.status, a.body)
	}
	ts.clk.Advance(ts.shop.payments.timeout)
	return <-res
}

// A declined card is a final answer, replayed to the same key; the order
// stays pending, free for a payment under a new key.
func TestPaymentDeclined(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		id := placeOrder(t, c)
		ts.prov.setNextFault(faultDecline)
		want(t, "the payment", c.post(payPath(id), "pay-1", ""), http.StatusPaymentRequired, "payment-declined")
		want(t, "its retry", c.post(payPath(id), "pay-1", ""), http.StatusPaymentRequired, "replayed")
		paid := c.post(payPath(id), "pay-2", "")
		want(t, "a new payment", paid, http.StatusOK, "acquired")
		if ch := ts.charges(); len(ch) != 1 || ch[0].ID != paid.order.ChargeID {
			t.Fatalf("charges %v, paid %s", ch, paid.body)
		}
	})
}

// A provider that charged nothing and said so (503), or could not be
// reached: the key is released, and the retry pays.
func TestPaymentProviderUnavailable(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		id := placeOrder(t, c)
		ts.prov.setNextFault(faultUnavailable)
		a := c.post(payPath(id), "pay", "")
		want(t, "the payment", a, http.StatusServiceUnavailable, "try-again")
		if a.header.Get("Retry-After") == "" {
			t.Fatal("no Retry-After")
		}
		real := ts.shop.payments.base
		ts.shop.payments.base = "http://127.0.0.1:1" // nothing listens there
		want(t, "the payment, provider unreachable", c.post(payPath(id), "pay", ""), http.StatusServiceUnavailable, "try-again")
		ts.shop.payments.base = real
		want(t, "the retry", c.post(payPath(id), "pay", ""), http.StatusOK, "acquired")
		if n := len(ts.charges()); n != 1 {
			t.Fatalf("%d charges", n)
		}
	})
}

// The shop dies between the charge and the commit (or before the charge):
// the key stays pending under a lease nobody renews. Retries wait while it
// lives; once it expires (on the store's clock, moved by the test), the
// key goes to review, and the resolver settles it by asking the provider:
// the charge it finds is kept; a charge it does not find was never made,
// and the retry makes it. Either way, one charge.
//
// SQLite only: on PostgreSQL the lease expires on the server's clock,
// which a test cannot move.
func TestCrashDuringPayment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		at          string
		retryFirst  bool // a client's retry, rather than recovery, finds the expired lease
		wantCharged int  // charges after the crash
		wantRep     idem.RecoverReport
		wantRetry   string // the retry's outcome after recovery
	}{
		{crashAfterCharge, false, 1, idem.RecoverReport{Escalated: 1, Completed: 1}, "replayed"},
		{crashAfterCharge, true, 1, idem.RecoverReport{Completed: 1}, "replayed"},
		{crashBeforeCharge, false, 0, idem.RecoverReport{Escalated: 1, Reopened: 1}, "acquired"},
	} {
		name := tc.at
		if tc.retryFirst {
			name += "/retry-first"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ts := newTestShop(t, onSQLite)
			c := ts.visitor()
			id := placeOrder(t, c)
			ts.shop.crash = func(ctx context.Context) {
				// The process dies here: nothing more is written, and
				// the client's connection drops.
				idem.LeaseFrom(ctx).Abandon()
				panic(http.ErrAbortHandler)
			}
			ts.shop.crashNext(tc.at)
			if a := c.post(payPath(id), "pay", ""); a.err == nil {
				t.Fatalf("the crashed payment answered %d %s", a.status, a.body)
			}
			if n := len(ts.charges()); n != tc.wantCharged {
				t.Fatalf("%d charges after the crash", n)
			}
			want(t, "a retry while the dead lease lives", c.post(payPath(id), "pay", ""), http.StatusConflict, "in_flight")

			ts.restart()
			ts.clk.Advance(31 * time.Second) // the dead process's lease expires
			if tc.retryFirst {
				want(t, "a retry after the lease expired", c.post(payPath(id), "pay", ""), http.StatusConflict, "needs_review")
			}
			if rep := ts.recover(); rep != tc.wantRep {
				t.Fatalf("recovery: %+v, want %+v", rep, tc.wantRep)
			}
			paid := c.post(payPath(id), "pay", "")
			want(t, "the retry after recovery", paid, http.StatusOK, tc.wantRetry)
			if ch := ts.charges(); len(ch) != 1 || paid.order.State != "paid" || paid.order.ChargeID != ch[0].ID {
				t.Fatalf("paid %s; charges %v", paid.body, ch)
			}
		})
	}
}

// A charge that went through but cannot be recorded (here, the order was
// taken from the payment meanwhile) is never answered as a failure that a
// retry would repeat: the key goes to review, and the resolver, which
// cannot record it either, leaves it there for a person to refund.
func TestChargeThatCannotBeRecorded(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		id := placeOrder(t, c)
		ts.shop.crash = func(ctx context.Context) {
			if _, err := ts.db.exec(ctx, `UPDATE orders SET payment_key = 'someone-else' WHERE id = ?`, id); err != nil {
				panic(err)
			}
		}
		ts.shop.crashNext(crashAfterCharge)
		want(t, "the payment", c.post(payPath(id), "pay", ""), http.StatusBadGateway, "payment-outcome-unknown")
		want(t, "its retry", c.post(payPath(id), "pay", ""), http.StatusConflict, "needs_review")
		if rep := ts.recover(); rep != (idem.RecoverReport{Unknown: 1}) {
			t.Fatalf("recovery: %+v", rep)
		}
		want(t, "the retry after recovery", c.post(payPath(id), "pay", ""), http.StatusConflict, "needs_review")
		rec, err := ts.db.store().Get(t.Context(), keyOf(c.user, opPay, "pay"))
		if err != nil || !strings.Contains(rec.Reason, "went through but recording it failed") {
			t.Fatalf("the key: %+v, %v", rec, err)
		}
		if n := len(ts.charges()); n != 1 {
			t.Fatalf("%d charges", n)
		}
	})
}

// A client that hangs up while the provider is slow abandons nothing: the
// charge goes on, and the shop records it with its answer for the retry.
func TestClientLeavesDuringPayment(t *testing.T) {
	t.Parallel()
	onEach(t, func(t *testing.T, backend string) {
		ts := newTestShop(t, backend)
		c := ts.visitor()
		id := placeOrder(t, c)
		ts.settled(opCreate)
		hanging := make(chan struct{}, 1)
		ts.prov.mu.Lock()
		ts.prov.hanging = func() { hanging <- struct{}{} }
		ts.prov.mu.Unlock()
		ts.prov.setNextFault(faultTimeout)

		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.srv.URL+payPath(id), nil)
		req.Header.Set(idem.HeaderName, "pay")
		res := make(chan answer, 1)
		go func() { res <- c.do(req) }()
		<-hanging // charged; the provider has not answered yet
		cancel()
		if a := <-res; a.err == nil {
			t.Fatalf("the client that hung up got %d", a.status)
		}
		ts.prov.resume <- struct{}{} // the provider answers after all
		if ev := ts.settled(opPay); ev.Settlement != "completed_tx" {
			t.Fatalf("the payment settled as %q (%s)", ev.Settlement, ev.Outcome)
		}
		paid := c.post(payPath(id), "pay", "")
		want(t, "the retry", paid, http.StatusOK, "replayed")
		if ch := ts.charges(); len(ch) != 1 || paid.order.ChargeID != ch[0].ID {
			t.Fatalf("paid %s; charges %v", paid.body, ch)
		}
	})
}

// A decline that cannot be recorded (the database refuses to let the
// order go) leaves no order claimed for good: the key goes to review, and
// once the database takes writes again the resolver lets the order go and
// stores the decline. (SQLite only: the fault is a SQLite trigger.)
func TestDeclineThatCannotBeRecorded(t *testing.T) {
	t.Parallel()
	ts := newTestShop(t, onSQLite)
	c := ts.visitor()
	id := placeOrder(t, c)
	unblock := ts.blockUnclaim()
	ts.prov.setNextFault(faultDecline)
	want(t, "the payment", c.post(payPath(id), "pay-1", ""), http.StatusPaymentRequired, "payment-declined")
	want(t, "its retry", c.post(payPath(id), "pay-1", ""), http.StatusConflict, "needs_review")
	want(t, "another payment", c.post(payPath(id), "pay-2", ""), http.StatusConflict, "payment-in-progress")
	if rep := ts.recover(); rep != (idem.RecoverReport{Unknown: 1}) {
		t.Fatalf("recovery while the fault lasts: %+v", rep)
	}
	unblock()
	if rep := ts.recover(); rep != (idem.RecoverReport{Completed: 1}) {
		t.Fatalf("recovery: %+v", rep)
	}
	want(t, "the retry", c.post(payPath(id), "pay-1", ""), http.StatusPaymentRequired, "replayed")
	paid := c.post(payPath(id), "pay-3", "")
	want(t, "a new payment", paid, http.StatusOK, "acquired")
	if ch := ts.charges(); len(ch) != 1 || ch[0].ID != paid.order.ChargeID {
		t.Fatalf("charges %v, paid %s", ch, paid.body)
	}
}

// The same when the provider was unavailable: the claim that cannot be
// released sends the key to review, and the resolver, finding no charge,
// releases the order and the key, so that the retry pays.
func TestUnavailableThatCannotBeRecorded(t *testing.T) {
	t.Parallel()
	ts := newTestShop(t, onSQLite)
	c := ts.visitor()
	id := placeOrder(t, c)
	unblock := ts.blockUnclaim()
	ts.prov.setNextFault(faultUnavailable)
	want(t, "the payment", c.post(payPath(id), "pay", ""), http.StatusServiceUnavailable, "try-again")
	want(t, "its retry", c.post(payPath(id), "pay", ""), http.StatusConflict, "needs_review")
	unblock()
	if rep := ts.recover(); rep != (idem.RecoverReport{Reopened: 1}) {
		t.Fatalf("recovery: %+v", rep)
	}
	paid := c.post(payPath(id), "pay", "")
	want(t, "the retry", paid, http.StatusOK, "acquired")
	if ch := ts.charges(); len(ch) != 1 || ch[0].ID != paid.order.ChargeID {
		t.Fatalf("charges %v, paid %s", ch, paid.body)
	}
}

// blockUnclaim makes the database refuse to let any order go (a SQLite
// trigger) until unblock is called.
func (ts *testShop) blockUnclaim() (unblock func()) {
	ts.t.Helper()
	exec := func(stmt string) {
		if _, err := ts.db.exec(ts.t.Context(), stmt); err != nil {
			ts.t.Fatal(err)
		}
	}
	exec(`CREATE TRIGGER no_unclaim BEFORE UPDATE OF payment_key ON orders
		WHEN NEW.payment_key IS NULL BEGIN SELECT RAISE(ABORT, 'injected fault'); END`)
	return func() { exec(`DROP TRIGGER no_unclaim`) }
}
