package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
)

// provider is the payment provider's double: an HTTP service, run in the
// shop's process by default, that charges at most once per idempotency key
// (Stripe's rule) and can be told to misbehave on the next charge. Its
// charges live in a SQLite file of its own, so that they outlive a crash of
// the shop, as a real provider's would.
type provider struct {
	db  *sql.DB
	clk clock
	log *slog.Logger

	mu    sync.Mutex
	fault string // the next charge's fault, or ""
	// hanging, if set, is called when a charge recorded under the
	// "timeout" fault starts to hang (tests wait for it); a value on
	// resume then makes it answer after all (a slow provider).
	hanging func()
	resume  chan struct{}
	stop    chan struct{} // closed by close: hanging charges give up
}

// The faults the provider can be told to show on the next charge.
const (
	faultTimeout     = "timeout"           // charge, then never answer
	faultAfterCharge = "fail-after-charge" // charge, then answer 500
	faultDecline     = "decline"           // decline the card (402), and keep that verdict under the key
	faultUnavailable = "unavailable"       // answer 503 and charge nothing
)

// openProvider opens (creating) the provider's file at path.
func openProvider(path string, clk clock, log *slog.Logger) (*provider, error) {
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		return nil, err
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS charges (
		idempotency_key TEXT PRIMARY KEY,
		id              TEXT NOT NULL UNIQUE,
		order_id        INTEGER NOT NULL,
		amount_cents    INTEGER NOT NULL,
		currency        TEXT NOT NULL,
		status          TEXT NOT NULL,
		created_at      INTEGER NOT NULL)`); err != nil {
		db.Close()
		return nil, err
	}
	return &provider{db: db, clk: clk, log: log, stop: make(chan struct{}), resume: make(chan struct{})}, nil
}

func (p *provider) close() {
	close(p.stop)
	p.db.Close()
}

func (p *provider) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", p.createCharge)
	mux.HandleFunc("GET /v1/charges/{key}", p.getCharge)
	mux.HandleFunc("GET /v1/charges", p.listCharges)
	mux.HandleFunc("POST /v1/faults", p.setFault)
	return mux
}

const chargeColumns = `idempotency_key, id, order_id, amount_cents, currency, status`

func scanCharge(r row) (*charge, error) {
	var c charge
	err := r.Scan(&c.Key, &c.ID, &c.OrderID, &c.AmountCents, &c.Currency, &c.Status)
	return &c, err
}

// createCharge answers POST /v1/charges. Insert-first against the key's
// primary key: the first request with a key charges, every later one gets
// that charge back (or 422 if it asks for something else).
func (p *provider) createCharge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idem.HeaderName)
	var in charge
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || key == "" || len(key) > 255 || in.OrderID <= 0 || in.AmountCents <= 0 || in.Currency == "" {
		jsonError(w, http.StatusBadRequest, "a charge needs an Idempotency-Key, order_id, amount_cents and currency")
		return
	}
	fault := p.takeFault()
	if fault == faultUnavailable {
		jsonError(w, http.StatusServiceUnavailable, "unavailable, nothing charged")
		return
	}
	status := "succeeded"
	if fault == faultDecline {
		status = "declined"
	}
	res, err := p.db.ExecContext(r.Context(), `INSERT INTO charges (idempotency_key, id, order_id, amount_cents, currency, status, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING`,
		key, "ch_"+randomHex(8), in.OrderID, in.AmountCents, in.Currency, status, p.clk.Now().UnixMilli())
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		jsonError(w, http.StatusServiceUnavailable, "unavailable, nothing charged")
		return
	}
	c, err := scanCharge(p.db.QueryRowContext(r.Context(), `SELECT `+chargeColumns+` FROM charges WHERE idempotency_key = ?`, key))
	if err != nil {
		jsonError(w, http.StatusInternalServerError, "internal")
		return
	}
	if n == 0 {
		if c.OrderID != in.OrderID || c.AmountCents != in.AmountCents || c.Currency != in.Currency {
			jsonError(w, http.StatusUnprocessableEntity, "this Idempotency-Key was used for another charge")
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
	} else {
		p.log.Info("provider: charged", "charge", c.ID, "status", c.Status, "amount_cents", c.AmountCents, "order", c.OrderID)
	}
	switch fault {
	case faultTimeout:
		p.mu.Lock()
		hanging := p.hanging
		p.mu.Unlock()
		if hanging != nil {
			hanging()
		}
		select { // until the client gives up
		case <-r.Context().Done():
			return
		case <-p.stop:
			return
		case <-p.resume:
		}
	case faultAfterCharge:
		jsonError(w, http.StatusInternalServerError, "internal")
		return
	}
	code := http.StatusCreated
	if c.Status == "declined" {
		code = http.StatusPaymentRequired
	}
	writeJSON(w, code, c)
}

// getCharge answers GET /v1/charges/{key}: the charge made under key, or
// 404 when there is none.
func (p *provider) getCharge(w http.ResponseWriter, r *http.Request) {
	c, err := scanCharge(p.db.QueryRowContext(r.Context(), `SELECT `+chargeColumns+` FROM charges WHERE idempotency_key = ?`, r.PathValue("key")))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		jsonError(w, http.StatusNotFound, "no charge under this key")
	case err != nil:
		jsonError(w, http.StatusInternalServerError, "internal")
	default:
		writeJSON(w, http.StatusOK, c)
	}
}

// listCharges answers GET /v1/charges: every charge, oldest first.
func (p *provider) listCharges(w http.ResponseWriter, r *http.Request) {
	cs, err := p.charges(r.Context())
	if err != nil {
		jsonError(w, http.StatusInternalServerError, "internal")
		return
	}
	writeJSON(w, http.StatusOK, cs)
}

func (p *provider) charges(ctx context.Context) ([]*charge, error) {
	cs := []*charge{}
	rows, err := p.db.QueryContext(ctx, `SELECT `+chargeColumns+` FROM charges ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	err = eachRow(rows, func(r row) error {
		c, err := scanCharge(r)
		cs = append(cs, c)
		return err
	})
	return cs, err
}

// setFault answers POST /v1/faults {"next": "timeout"}: the next charge
// shows that fault.
func (p *provider) setFault(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Next string `json:"next"`
	}
	err := json.NewDecoder(r.Body).Decode(&in)
	switch {
	case err != nil:
	case in.Next == faultTimeout, in.Next == faultAfterCharge, in.Next == faultDecline, in.Next == faultUnavailable, in.Next == "":
		p.setNextFault(in.Next)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	jsonError(w, http.StatusBadRequest, "next must be timeout, fail-after-charge, decline, unavailable or empty")
}

func (p *provider) setNextFault(f string) {
	p.mu.Lock()
	p.fault = f
	p.mu.Unlock()
}

func (p *provider) takeFault() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.fault
	p.fault = ""
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func jsonError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
