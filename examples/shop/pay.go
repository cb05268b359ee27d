package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-dev/idem"
)

// pay answers POST /orders/{id}/pay: it charges the order's amount with
// the payment provider and moves the order pending → paid. It is an
// external operation: the charge happens outside the database, so a
// payment whose outcome is unknown is never run again blindly; its key
// goes to review, and the resolver asks the provider.
//
//  1. claim: one guarded update makes this payment attempt (its provider
//     key) the only one that may charge the order, so two different keys
//     paying one order at once cannot both charge it;
//  2. charge, with the provider key derived from the Idempotency-Key: a
//     retry asks for the same charge, which the provider never makes twice;
//  3. record: pending → paid and the answer, in one transaction
//     (CompleteTx).
func (s *shop) pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	lease := idem.LeaseFrom(ctx)
	user, key := lease.Key().Scope, chargeKey(lease.Key())
	id, ok := orderID(w, r)
	if !ok || !emptyBody(w, r) {
		return
	}
	o, err := s.claim(ctx, user, id, key)
	if err != nil {
		s.answerTxError(w, r, err)
		return
	}
	// From the claim on, the payment is the shop's business: a client that
	// hangs up must not abandon a charge halfway, nor leave one
	// unrecorded. The provider's calls have their own timeout; recording
	// has this bound.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	s.maybeCrash(ctx, crashBeforeCharge)
	outcome, ch, err := s.payments.charge(ctx, key, o)
	switch outcome {
	case declined:
		s.finishUnpaid(ctx, w, user, id, key, declinedResponse(ch))
		return
	case rejected:
		s.finishUnpaid(ctx, w, user, id, key, problemResponse(probPaymentRejected, err.Error()))
		return
	case unavailable:
		// Nothing was charged: release the claim and the key (503). If
		// the claim cannot be released, the key goes to review instead,
		// where the resolver, finding no charge, releases both.
		if _, uerr := s.unclaim(ctx, s.db, user, id, key); uerr != nil {
			s.log.ErrorContext(ctx, "shop: releasing a payment claim failed", "order", id, "error", uerr)
			s.escalate(ctx, lease, "the payment charged nothing but releasing the order failed: "+uerr.Error())
		}
		probTryAgain.write(w, "Nothing was charged: "+err.Error()+". Retry with the same Idempotency-Key.")
		return
	case unknown:
		s.outcomeUnknown(ctx, w, lease, "the payment provider gave no clear answer: "+err.Error())
		return
	}
	s.maybeCrash(ctx, crashAfterCharge)
	var resp *idem.Response
	err = s.db.inTx(ctx, func(tx txQuerier) error {
		o, err := markPaid(ctx, tx, s.clk.Now().UnixMilli(), user, id, key, ch.ID)
		if err != nil {
			return err
		}
		resp = orderResponse(http.StatusOK, o)
		return tx.completeTx(ctx, lease, resp)
	})
	if err != nil {
		s.outcomeUnknown(ctx, w, lease, fmt.Sprintf("charge %s went through but recording it failed: %v", ch.ID, err))
		return
	}
	writeResponse(w, resp)
}

// recordTimeout bounds the recording of a payment once its charge was
// asked for.
const recordTimeout = 30 * time.Second

// claim makes attempt key the one that may charge user's order id, if the
// order is pending and no other attempt holds it. The same key may claim
// again (a retry after a release).
func (s *shop) claim(ctx context.Context, user string, id int64, key string) (*order, error) {
	var o *order
	err := s.db.inTx(ctx, func(tx txQuerier) error {
		n, err := tx.exec(ctx, `UPDATE orders SET payment_key = ?, updated_at = ?
			WHERE id = ? AND user_id = ? AND state = 'pending' AND (payment_key IS NULL OR payment_key = ?)`,
			key, s.clk.Now().UnixMilli(), id, user, key)
		if err != nil {
			return err
		}
		if o, err = loadOrder(ctx, tx, user, id); err != nil {
			return err
		}
		switch {
		case n == 1:
			return nil
		case o.State != "pending":
			return refused(o, "paid", "pending")
		}
		return refuse(probPaymentBusy, "Order %d is being paid by another request; its outcome decides this order's.", o.ID)
	})
	return o, err
}

// unclaim lets go of attempt key's claim on order id, which it did not pay.
func (s *shop) unclaim(ctx context.Context, q querier, user string, id int64, key string) (bool, error) {
	n, err := q.exec(ctx, `UPDATE orders SET payment_key = NULL, updated_at = ?
		WHERE id = ? AND user_id = ? AND state = 'pending' AND payment_key = ?`, s.clk.Now().UnixMilli(), id, user, key)
	return n == 1, err
}

// markPaid moves order id pending → paid with chargeID, if attempt key
// holds it. An order already paid by that very charge (a resolver's second
// pass) is fine too; anything else is a charge that has no order to pay,
// for a person to refund.
func markPaid(ctx context.Context, q querier, now int64, user string, id int64, key, chargeID string) (*order, error) {
	n, err := q.exec(ctx, `UPDATE orders SET state = 'paid', charge_id = ?, updated_at = ?
		WHERE id = ? AND user_id = ? AND state = 'pending' AND payment_key = ?`, chargeID, now, id, user, key)
	if err != nil {
		return nil, err
	}
	o, err := loadOrder(ctx, q, user, id)
	if err != nil {
		return nil, err
	}
	if n == 0 && o.ChargeID != chargeID {
		return nil, fmt.Errorf("order %d is %s (charge %q) and not held by this payment, which charged %s", id, o.State, o.ChargeID, chargeID)
	}
	return o, nil
}

// finishUnpaid ends a payment that charged nothing: the claim goes, and the
// answer is stored, in one transaction.
func (s *shop) finishUnpaid(ctx context.Context, w http.ResponseWriter, user string, id int64, key string, resp *idem.Response) {
	err := s.db.inTx(ctx, func(tx txQuerier) error {
		if _, err := s.unclaim(ctx, tx, user, id, key); err != nil {
			return err
		}
		return tx.completeTx(ctx, idem.LeaseFrom(ctx), resp)
	})
	if err != nil {
		// The order may still be claimed. The key goes to review (if
		// CompleteTx ran, the middleware reads back what committed and
		// does it), where the resolver finds the verdict under the
		// provider key, lets the order go and stores this answer.
		s.log.ErrorContext(ctx, "shop: recording an unpaid payment failed", "order", id, "error", err)
		lease := idem.LeaseFrom(ctx)
		if _, prepared := lease.PreparedTx(); !prepared {
			s.escalate(ctx, lease, "the payment charged nothing but recording that failed: "+err.Error())
		}
	}
	writeResponse(w, resp)
}

// outcomeUnknown answers a payment whose charge may have happened. Its key
// goes to review (unless a transaction that called CompleteTx may have
// committed: the middleware reads that back and escalates if it did not),
// where the resolver asks the provider; retries get 409 until then, and
// the answer once it is settled.
func (s *shop) outcomeUnknown(ctx context.Context, w http.ResponseWriter, lease *idem.Lease, reason string) {
	if _, prepared := lease.PreparedTx(); !prepared {
		s.escalate(ctx, lease, reason)
	}
	probPaymentUnknown.write(w, "Your payment may have gone through; the shop is checking with the payment provider. Retry with the same Idempotency-Key in a few seconds: you will not be charged twice.")
}

// escalate sends the payment's key to review. If even that cannot be
// recorded, the key is left pending: once its lease expires, recovery
// sends it to review all the same.
func (s *shop) escalate(ctx context.Context, lease *idem.Lease, reason string) {
	if err := lease.Escalate(ctx, reason); err != nil {
		s.log.LogAttrs(ctx, slog.LevelError, "shop: escalating a payment failed", slog.Any("error", err))
		lease.Abandon()
	}
}

// problemResponse is p as a stored answer.
func problemResponse(p shopProblem, detail string) *idem.Response {
	body, _ := json.Marshal(p.doc(detail))
	return &idem.Response{Status: p.status, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: append(body, '\n')}
}

// declinedResponse is the answer to a payment the provider declined.
func declinedResponse(ch *charge) *idem.Response {
	return problemResponse(probDeclined, fmt.Sprintf("The card was declined (charge %s); nothing was charged. Pay again with a new Idempotency-Key.", ch.ID))
}

// emptyBody checks that a request that carries no data has none (or {}).
func emptyBody(w http.ResponseWriter, r *http.Request) bool {
	if r.ContentLength == 0 {
		return true
	}
	var none struct{}
	return decodeJSON(w, r, &none)
}
