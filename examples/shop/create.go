package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/idem-dev/idem"
)

// maxQty bounds one order line.
const maxQty = 10

// createOrder answers POST /orders {"sku": "mug", "qty": 1}. Its
// Idempotency-Key is the order's client order ID. In one transaction it
// inserts the order (insert-first against UNIQUE (user_id,
// client_order_id)), takes the stock with a guarded update, and stores the
// answer with CompleteTx: the order and the answer commit together or not
// at all.
func (s *shop) createOrder(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	lease := idem.LeaseFrom(ctx)
	user, key := lease.Key().Scope, lease.Key().Key
	var in struct {
		SKU string `json:"sku"`
		Qty int64  `json:"qty"`
	}
	if !decodeJSON(w, r, &in) {
		return
	}
	if in.SKU == "" || len(in.SKU) > 64 || in.Qty < 1 || in.Qty > maxQty {
		probBadRequest.write(w, "An order needs a sku and a qty from 1 to 10.")
		return
	}
	var resp *idem.Response
	err := s.db.inTx(ctx, func(tx txQuerier) error {
		var price int64
		err := tx.queryRow(ctx, `SELECT price_cents FROM products WHERE sku = ?`, in.SKU).Scan(&price)
		if errors.Is(err, errNoRows) {
			return refuse(probUnknownProduct, "The shop sells no %q.", in.SKU)
		}
		if err != nil {
			return err
		}
		now := s.clk.Now().UnixMilli()
		var id int64
		err = tx.queryRow(ctx, `INSERT INTO orders (user_id, client_order_id, sku, qty, amount_cents, state, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)
			ON CONFLICT (user_id, client_order_id) DO NOTHING RETURNING id`,
			user, key, in.SKU, in.Qty, price*in.Qty, now, now).Scan(&id)
		status := http.StatusCreated
		switch {
		case errors.Is(err, errNoRows):
			// The order exists although idem had no record of the key
			// (its record expired, or was deleted): the unique
			// constraint caught the duplicate. Same order: report it.
			existing, err := scanOrder(tx.queryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE user_id = ? AND client_order_id = ?`, user, key))
			if err != nil {
				return err
			}
			if existing.SKU != in.SKU || existing.Qty != in.Qty {
				return refuse(probOrderIDReused, "Order %d was placed with this client order ID for %d × %s.", existing.ID, existing.Qty, existing.SKU)
			}
			id, status = existing.ID, http.StatusOK
		case err != nil:
			return err
		default:
			n, err := tx.exec(ctx, `UPDATE products SET stock = stock - ? WHERE sku = ? AND stock >= ?`, in.Qty, in.SKU, in.Qty)
			if err != nil {
				return err
			}
			if n == 0 {
				return refuse(probOutOfStock, "Fewer than %d × %s are left.", in.Qty, in.SKU)
			}
		}
		o, err := loadOrder(ctx, tx, user, id)
		if err != nil {
			return err
		}
		resp = orderResponse(status, o)
		return tx.completeTx(ctx, lease, resp)
	})
	if err != nil {
		s.answerTxError(w, r, err)
		return
	}
	writeResponse(w, resp)
}

// decodeJSON reads r's body, one JSON object with known fields only, into
// v; it answers 400 and reports false when it cannot.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.Decode(new(json.RawMessage)) != io.EOF {
		err = errors.New("more than one JSON value")
	}
	if err != nil {
		probBadRequest.write(w, "The body must be one JSON object: "+err.Error())
		return false
	}
	return true
}

// jsonOnly refuses a request with a body that is not JSON before idem
// reserves its key. It also keeps cross-site HTML forms out: they cannot
// send JSON, nor the Idempotency-Key header, without a CORS preflight.
func jsonOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
			if !strings.EqualFold(strings.TrimSpace(ct), "application/json") {
				probMediaType.write(w, "Send the body as application/json.")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
