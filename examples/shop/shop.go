package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/idem-dev/idem"
)

// shop is the example shop: its handlers, its database (with idem's
// records in it), the engine and the payment provider's client.
type shop struct {
	db        database
	engine    *idem.Engine
	sessions  *sessions
	payments  *payments
	clk       clock
	log       *slog.Logger
	faults    bool // POST /debug/crash is served
	onOutcome func(idem.Event)
	reviewed  chan struct{} // a key went to review: run the resolver

	crashMu sync.Mutex
	crashAt string // where the next payment crashes: "", crashBeforeCharge or crashAfterCharge
	// crash ends the process where a payment was told to crash; tests
	// replace it with a crash of the request alone.
	crash func(ctx context.Context)
}

// shopConfig is what newShop needs.
type shopConfig struct {
	DB       database
	Payments *payments
	Clock    clock
	Logger   *slog.Logger
	// Lease is how long a request holds its key before recovery may
	// decide its process died. Defaults to 30s.
	Lease time.Duration
	// Faults serves POST /debug/crash, which makes the next payment crash
	// the process at a chosen point.
	Faults bool
	// OnOutcome, if set, is told about every protected request once it is
	// answered and its key settled (idem.Config.OnOutcome): the place for
	// metrics.
	OnOutcome func(idem.Event)
}

// newShop creates the tables (on a new database, with the catalogue) and
// the engine.
func newShop(ctx context.Context, cfg shopConfig) (*shop, error) {
	if err := migrateAndSeed(ctx, cfg.DB); err != nil {
		return nil, err
	}
	sess, err := loadSessions(ctx, cfg.DB)
	if err != nil {
		return nil, err
	}
	s := &shop{db: cfg.DB, sessions: sess, payments: cfg.Payments, clk: cfg.Clock, log: cfg.Logger,
		faults: cfg.Faults, onOutcome: cfg.OnOutcome, reviewed: make(chan struct{}, 1)}
	s.crash = func(context.Context) {
		s.log.Error("shop: crashing as asked by POST /debug/crash")
		os.Exit(3)
	}
	s.engine, err = idem.NewEngine(cfg.DB.store(), idem.EngineConfig{Lease: cfg.Lease, Logger: cfg.Logger, OnReview: s.onReview})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// handler routes the shop. POSTs that change orders are protected by idem:
// each needs an Idempotency-Key, scoped to the session's user.
func (s *shop) handler() http.Handler {
	protect := idem.Middleware(s.engine, idem.Config{
		Scope:  s.sessions.user,
		Policy: idem.Policy{Kind: idem.Transactional, MaxRequestBody: 4 << 10},
		Routes: map[string]idem.Policy{
			opPay: {Kind: idem.External, MaxRequestBody: 4 << 10},
		},
		Logger:    s.log,
		OnOutcome: s.onOutcome,
	})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.page)
	mux.Handle("POST /orders", jsonOnly(protect(http.HandlerFunc(s.createOrder))))
	mux.Handle("POST /orders/{id}/pay", jsonOnly(protect(http.HandlerFunc(s.pay))))
	mux.Handle("POST /orders/{id}/ship", jsonOnly(protect(http.HandlerFunc(s.ship))))
	mux.HandleFunc("GET /orders", s.listOrders)
	mux.HandleFunc("GET /orders/{id}", s.getOrder)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if s.faults {
		mux.HandleFunc("POST /debug/crash", s.armCrash)
	}
	return mux
}

// requireUser returns the session's user, or answers 401.
func (s *shop) requireUser(w http.ResponseWriter, r *http.Request) (string, bool) {
	user, err := s.sessions.user(r)
	var se *idem.ScopeError
	switch {
	case errors.As(err, &se):
		idem.WriteProblem(w, idem.SituationScopeDenied.ProblemDoc(se.Detail, ""))
		return "", false
	case err != nil:
		idem.WriteProblem(w, idem.SituationScopeMissing.ProblemDoc("Open the shop's page first: it gives you a session cookie.", ""))
		return "", false
	}
	return user, true
}

// Where POST /debug/crash can make a payment crash.
const (
	crashBeforeCharge = "before-charge"
	crashAfterCharge  = "after-charge"
)

// armCrash answers POST /debug/crash?at=after-charge (or before-charge):
// the next payment crashes the process there.
func (s *shop) armCrash(w http.ResponseWriter, r *http.Request) {
	at := r.URL.Query().Get("at")
	if at != crashBeforeCharge && at != crashAfterCharge {
		probBadRequest.write(w, "at must be before-charge or after-charge")
		return
	}
	s.crashNext(at)
	w.WriteHeader(http.StatusNoContent)
}

// crashNext makes the next payment crash at at.
func (s *shop) crashNext(at string) {
	s.crashMu.Lock()
	s.crashAt = at
	s.crashMu.Unlock()
}

// maybeCrash crashes if the next payment was told to crash at.
func (s *shop) maybeCrash(ctx context.Context, at string) {
	s.crashMu.Lock()
	armed := s.crashAt == at
	if armed {
		s.crashAt = ""
	}
	s.crashMu.Unlock()
	if armed {
		s.crash(ctx)
	}
}
