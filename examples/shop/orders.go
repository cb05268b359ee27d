package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idem-dev/idem"
)

// The operations idem protects, as the middleware names them (the method
// and the route pattern).
const (
	opCreate = "POST /orders"
	opPay    = "POST /orders/{id}/pay"
	opShip   = "POST /orders/{id}/ship"
)

// product is a row of products.
type product struct {
	SKU        string `json:"sku"`
	Name       string `json:"name"`
	PriceCents int64  `json:"price_cents"`
	Stock      int64  `json:"stock"`
}

// order is a row of orders, as clients see it.
type order struct {
	ID            int64  `json:"id"`
	ClientOrderID string `json:"client_order_id"`
	SKU           string `json:"sku"`
	Qty           int64  `json:"qty"`
	AmountCents   int64  `json:"amount_cents"`
	State         string `json:"state"`
	ChargeID      string `json:"charge_id,omitempty"`
}

const orderColumns = `id, client_order_id, sku, qty, amount_cents, state, COALESCE(charge_id, '')`

func scanOrder(r row) (*order, error) {
	var o order
	if err := r.Scan(&o.ID, &o.ClientOrderID, &o.SKU, &o.Qty, &o.AmountCents, &o.State, &o.ChargeID); err != nil {
		return nil, err
	}
	return &o, nil
}

// loadOrder returns user's order id, or errNoRows: another user's order is
// as absent as one that does not exist.
func loadOrder(ctx context.Context, q querier, user string, id int64) (*order, error) {
	return scanOrder(q.queryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE id = ? AND user_id = ?`, id, user))
}

// errRefused carries a refusal out of a transaction, which then rolls back.
type errRefused struct {
	p      shopProblem
	detail string
}

func (e *errRefused) Error() string { return e.p.title + ": " + e.detail }

func refuse(p shopProblem, format string, args ...any) error {
	return &errRefused{p: p, detail: fmt.Sprintf(format, args...)}
}

// orderResponse is the answer that reports o, as stored for replay.
func orderResponse(status int, o *order) *idem.Response {
	body, _ := json.Marshal(o) // cannot fail: plain fields
	h := http.Header{"Content-Type": {"application/json"}}
	if status == http.StatusCreated {
		h.Set("Location", "/orders/"+strconv.FormatInt(o.ID, 10))
	}
	return &idem.Response{Status: status, Header: h, Body: append(body, '\n')}
}

// writeResponse writes resp, the answer that was stored.
func writeResponse(w http.ResponseWriter, resp *idem.Response) {
	for name, vs := range resp.Header {
		w.Header()[name] = vs
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// answerTxError answers the error of a business transaction that changed
// nothing outside the database: a refusal as its problem, an order that is
// not the user's as 404, anything else as "nothing was done, try again"
// (the transaction rolled back, and 503 releases the key).
func (s *shop) answerTxError(w http.ResponseWriter, r *http.Request, err error) {
	var ref *errRefused
	if errors.As(err, &ref) {
		ref.p.write(w, ref.detail)
		return
	}
	if errors.Is(err, errNoRows) {
		probNoOrder.write(w, "You have no order "+r.PathValue("id")+".")
		return
	}
	s.log.ErrorContext(r.Context(), "shop: transaction failed", "operation", r.Pattern, "error", err)
	probTryAgain.write(w, "The order could not be saved; nothing was done. Retry with the same Idempotency-Key.")
}

// orderID parses the {id} of the request's path.
func orderID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		probNoOrder.write(w, "Order IDs are positive integers.")
		return 0, false
	}
	return id, true
}

// getOrder answers GET /orders/{id}.
func (s *shop) getOrder(w http.ResponseWriter, r *http.Request) {
	user, ok := s.requireUser(w, r)
	if !ok {
		return
	}
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	o, err := loadOrder(r.Context(), s.db, user, id)
	if err != nil {
		s.answerTxError(w, r, err)
		return
	}
	writeResponse(w, orderResponse(http.StatusOK, o))
}

// listOrders answers GET /orders: the user's orders, newest first.
func (s *shop) listOrders(w http.ResponseWriter, r *http.Request) {
	user, ok := s.requireUser(w, r)
	if !ok {
		return
	}
	orders, err := s.ordersOf(r.Context(), user)
	if err != nil {
		s.answerTxError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(orders)
}
