package main

import (
	"context"
	"net/http"

	"github.com/idem-dev/idem"
)

// ship answers POST /orders/{id}/ship, the warehouse's word that a paid
// order left (in this example, any user may ship their own orders). The
// state moves paid → shipped by one guarded update: it changes one row, or
// none and the request is refused, so a ship that arrives before the
// payment, or a second one, never ships anything twice.
func (s *shop) ship(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	lease := idem.LeaseFrom(ctx)
	user := lease.Key().Scope
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	var resp *idem.Response
	err := s.db.inTx(ctx, func(tx txQuerier) error {
		n, err := tx.exec(ctx, `UPDATE orders SET state = 'shipped', updated_at = ?
			WHERE id = ? AND user_id = ? AND state = 'paid'`, s.clk.Now().UnixMilli(), id, user)
		if err != nil {
			return err
		}
		o, err := loadOrder(ctx, tx, user, id)
		if err != nil {
			return err // errNoRows: not the user's order
		}
		if n == 0 {
			return refused(o, "shipped", "paid")
		}
		resp = orderResponse(http.StatusOK, o)
		return tx.completeTx(ctx, lease, resp)
	})
	if err != nil {
		s.answerTxError(w, r, err)
		return
	}
	writeResponse(w, resp)
}

// refused is the refusal of moving o to state to, which only an order in
// state from may take.
func refused(o *order, to, from string) error {
	return refuse(probRefused, "Order %d is %s; only a %s order can be %s.", o.ID, o.State, from, to)
}

// ordersOf returns user's orders, newest first.
func (s *shop) ordersOf(ctx context.Context, user string) ([]*order, error) {
	orders := []*order{}
	err := s.db.each(ctx, `SELECT `+orderColumns+` FROM orders WHERE user_id = ? ORDER BY id DESC LIMIT 50`, []any{user}, func(r row) error {
		o, err := scanOrder(r)
		if err == nil {
			orders = append(orders, o)
		}
		return err
	})
	return orders, err
}
