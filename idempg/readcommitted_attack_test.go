package idempg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// onePool returns a pool of a single connection whose sessions default to
// isolation, so that every call of a store on it uses the same connection.
func onePool(t *testing.T, isolation string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = isolation
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// wantPending fails t unless k is still pending under token.
func wantPending(t *testing.T, s *idempg.Store, k idemstore.Key, token string) {
	t.Helper()
	rec, err := s.Get(t.Context(), k)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if rec.State != idemstore.StatePending || rec.Token != token {
		t.Fatalf("record = %s under %q, want pending under %q", rec.State, rec.Token, token)
	}
}

// TestLoneCallOnKilledConnectionBeforeProbe kills the backend of a pooled
// connection that has not yet been asked its default isolation, then
// completes a record alone on it: the probe fails, and the Complete, never
// sent, must fail as ErrUnavailable (transient, nothing changed), leave the
// record pending, and succeed when tried again on a new connection.
func TestLoneCallOnKilledConnectionBeforeProbe(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := onePool(t, level)
			s := newStore(t, pool, idempg.Config{DisableBatch: true, DisableNotify: true})
			ctx := t.Context()
			k := reserveKey(t, s, "killed")
			var pid uint32
			if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			if _, err := testPool(t, "").Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				t.Fatal(err)
			}
			p := idemstore.CompleteParams{Key: k, Token: "tok-killed", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}
			err := s.Complete(ctx, p)
			if err == nil {
				// The pool may have noticed the dead connection and dialled anew.
				t.Skip("the pool replaced the killed connection before use")
			}
			if !errors.Is(err, idemstore.ErrUnavailable) {
				t.Fatalf("Complete on a killed connection = %v, want ErrUnavailable", err)
			}
			wantPending(t, s, k, "tok-killed")
			if err := s.Complete(ctx, p); err != nil {
				t.Fatalf("Complete again: %v", err)
			}
		})
	}
}

// TestLoneCallCancelledBeforeProbe completes a record alone with a context
// already cancelled: the probe and the statement are never sent. The error
// must say context.Canceled, the record stay pending, and the connection
// (its cached default included) serve the next call correctly.
func TestLoneCallCancelledBeforeProbe(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := onePool(t, level)
			s := newStore(t, pool, idempg.Config{DisableBatch: true, DisableNotify: true})
			k := reserveKey(t, s, "cancelled")
			p := idemstore.CompleteParams{Key: k, Token: "tok-cancelled", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}
			cctx, cancel := context.WithCancel(t.Context())
			cancel()
			if err := s.Complete(cctx, p); !errors.Is(err, context.Canceled) {
				t.Fatalf("Complete with a cancelled context = %v, want context.Canceled", err)
			}
			wantPending(t, s, k, "tok-cancelled")
			if err := s.Complete(t.Context(), p); err != nil {
				t.Fatalf("Complete again: %v", err)
			}
		})
	}
}

// TestLoneCallAfterStaleDefault: the store has asked a connection its
// default (READ COMMITTED) and kept the answer; other code on the same pool
// then runs SET default_transaction_isolation on that connection. A lone
// Complete that waits for the record's row while a waiter subscribes must
// still wake that waiter. At SERIALIZABLE the first try fails as
// ErrRetryable (nothing changed) and the store asks the connection's
// default again, so a retry, as idem's settlement makes, succeeds and
// wakes the waiter. At REPEATABLE READ the store cannot notice: that case
// documents the limitation (readCommittedByDefault) and is skipped.
func TestLoneCallAfterStaleDefault(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgxpool.ParseConfig(testURL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 4
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			ctx := t.Context()
			s, schema := newStoreIn(t, pool, idempg.Config{DisableBatch: true})
			// Every connection of the pool has answered the probe, READ
			// COMMITTED, and then been SET to level by other code.
			conns := make([]*pgxpool.Conn, 0, 4)
			for range 4 {
				c, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			for _, c := range conns {
				c.Conn().PgConn().CustomData()["idempg.readCommittedByDefault"] = true
				if _, err := c.Exec(ctx, "SET default_transaction_isolation = '"+level+"'"); err != nil {
					t.Fatal(err)
				}
				c.Release()
			}
			k := reserveKey(t, s, "stale")
			pid, release := shareLock(t, pool, schema, k)
			done := make(chan error, 1)
			p := idemstore.CompleteParams{Key: k, Token: "tok-stale", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}
			go func() { done <- s.Complete(ctx, p) }()
			waitBlockedBy(t, pool, pid)
			woken := subscribe(t, s, k)
			release()
			err = <-done
			if errors.Is(err, idemstore.ErrRetryable) {
				err = s.Complete(ctx, p) // on the same connection: MaxConns is 4, all idle
			}
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if level == "repeatable read" {
				select {
				case <-woken:
				default:
					t.Skip("known limitation: a SET default_transaction_isolation = 'repeatable read' on a pooled connection after the store asked its default goes unseen")
				}
			}
			waitWake(t, woken, "a waiter that subscribed while Complete waited, after SET default_transaction_isolation")
			// The connection that failed was asked again and now wraps its
			// statements: the next waiter racing a settlement on it is safe.
			reasked := false
			for _, c := range pool.AcquireAllIdle(ctx) {
				if rc, ok := c.Conn().PgConn().CustomData()["idempg.readCommittedByDefault"].(bool); ok && !rc {
					reasked = true
				}
				c.Release()
			}
			if !reasked {
				t.Fatal("no connection was asked its default again after a serialization failure of a lone statement")
			}
		})
	}
}

// TestLoneCallCancelledWhileWaiting cancels a lone Complete while it waits
// for the record's row (sent, not yet applied; wrapped in BEGIN ... COMMIT
// where the default is not READ COMMITTED). The error must say
// context.Canceled, never success nor ErrLeaseLost: the server has the
// statement (and its COMMIT) and may still apply it once the row is free,
// so the outcome is unknown. idem then escalates the key, as here: the key
// must end settled (completed with this answer, or in review), never left
// pending by a transaction kept open on the connection.
func TestLoneCallCancelledWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := testPool(t, level)
			s, schema := newStoreIn(t, pool, idempg.Config{DisableBatch: true, DisableNotify: true})
			k := reserveKey(t, s, "waiting")
			p := idemstore.CompleteParams{Key: k, Token: "tok-waiting", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}
			pid, release := shareLock(t, pool, schema, k)
			cctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- s.Complete(cctx, p) }()
			waitBlockedBy(t, pool, pid)
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("Complete cancelled while waiting = %v, want context.Canceled", err)
			}
			release()
			err := s.Escalate(t.Context(), idemstore.EscalateParams{Key: k, Token: "tok-waiting", Reason: "unknown"})
			if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("Escalate after the cancelled Complete: %v", err)
			}
			rec, gerr := s.Get(t.Context(), k)
			if gerr != nil {
				t.Fatal(gerr)
			}
			switch {
			case rec.State == idemstore.StateCompleted && rec.Response != nil && rec.Response.Status == 200:
			case rec.State == idemstore.StateNeedsReview && err == nil:
			default:
				t.Fatalf("after a cancelled Complete and an Escalate: record %s (Escalate: %v)", rec.State, err)
			}
		})
	}
}
