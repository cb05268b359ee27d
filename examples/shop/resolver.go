package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// kindOf says how recovery treats an expired lease of each operation: a
// payment may have charged (external), the others commit their effect with
// their answer (transactional).
func kindOf(k idem.Key) idem.Kind {
	if k.Operation == opPay {
		return idem.External
	}
	return idem.Transactional
}

// resolve settles a key in review by asking where its effect would be: the
// payment provider, with the same key, for a payment; the orders table for
// an order. It never runs the operation again.
func (s *shop) resolve(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
	switch rec.Key.Operation {
	case opPay:
		return s.resolvePayment(ctx, rec)
	case opCreate:
		o, err := scanOrder(s.db.queryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE user_id = ? AND client_order_id = ?`, rec.Key.Scope, rec.Key.Key))
		switch {
		case errors.Is(err, errNoRows):
			return idem.Resolution{Verdict: idem.VerdictNotHappened, Reason: "no order has this client order ID"}, nil
		case err != nil:
			return idem.Resolution{}, err
		}
		return idem.Resolution{Verdict: idem.VerdictCompleted, Response: orderResponse(http.StatusCreated, o),
			Reason: fmt.Sprintf("order %d has this client order ID", o.ID)}, nil
	}
	return idem.Resolution{Verdict: idem.VerdictUnknown}, nil
}

func (s *shop) resolvePayment(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
	user, key := rec.Key.Scope, chargeKey(rec.Key)
	var id int64
	if rec.Request != nil {
		id = orderIDFromPath(rec.Request.Path)
	}
	if id == 0 {
		return idem.Resolution{Verdict: idem.VerdictUnknown, Reason: "the record does not say which order it paid"}, nil
	}
	ch, found, err := s.payments.lookup(ctx, key)
	if err != nil {
		return idem.Resolution{}, err // asked again on the next pass
	}
	if !found {
		if _, err := s.unclaim(ctx, s.db, user, id, key); err != nil {
			return idem.Resolution{}, err
		}
		return idem.Resolution{Verdict: idem.VerdictNotHappened, Reason: "the payment provider has no charge with key " + key}, nil
	}
	if ch.Status == "declined" {
		if _, err := s.unclaim(ctx, s.db, user, id, key); err != nil {
			return idem.Resolution{}, err
		}
		return idem.Resolution{Verdict: idem.VerdictCompleted, Response: declinedResponse(ch), Reason: "the payment provider declined charge " + ch.ID}, nil
	}
	o, err := markPaid(ctx, s.db, s.clk.Now().UnixMilli(), user, id, key, ch.ID)
	if err != nil {
		// Money taken for an order that cannot take it: a person refunds.
		s.log.WarnContext(ctx, "shop: a charge the resolver cannot record; refund it by hand", "charge", ch.ID, "order", id, "error", err)
		return idem.Resolution{Verdict: idem.VerdictUnknown, Reason: err.Error()}, nil
	}
	return idem.Resolution{Verdict: idem.VerdictCompleted, Response: orderResponse(http.StatusOK, o),
		Reason: "the payment provider has charge " + ch.ID + " under key " + key}, nil
}

// orderIDFromPath reads the order ID of "/orders/{id}/pay", or 0.
func orderIDFromPath(path string) int64 {
	rest, ok := strings.CutPrefix(path, "/orders/")
	if !ok {
		return 0
	}
	rest, ok = strings.CutSuffix(rest, "/pay")
	if !ok {
		return 0
	}
	id, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || id <= 0 {
		return 0
	}
	return id
}

// recoverOnce settles what crashed or uncertain requests left: expired
// leases (released when transactional, sent to review when external), then
// keys in review, through the resolver.
func (s *shop) recoverOnce(ctx context.Context) (idem.RecoverReport, error) {
	rep, err := s.engine.Recover(ctx, idem.RecoverOptions{KindOf: kindOf, Resolver: idem.ResolverFunc(s.resolve)})
	if rep != (idem.RecoverReport{}) || err != nil {
		s.log.LogAttrs(ctx, slog.LevelInfo, "shop: recovery pass", slog.Int("released", rep.Released), slog.Int("escalated", rep.Escalated),
			slog.Int("completed", rep.Completed), slog.Int("reopened", rep.Reopened), slog.Int("unknown", rep.Unknown), slog.Any("error", err))
	}
	return rep, err
}

// recoverLoop runs recoverOnce every interval, and at once when a key goes
// to review, until ctx ends.
func (s *shop) recoverLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.reviewed:
		}
		_, _ = s.recoverOnce(ctx)
	}
}

// onReview wakes the recovery loop: a key just went to review.
func (s *shop) onReview(context.Context, idem.Key, string) {
	select {
	case s.reviewed <- struct{}{}:
	default:
	}
}
