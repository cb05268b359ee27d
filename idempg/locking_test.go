package idempg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// These tests hold a share lock on a record's row from a transaction of
// their own, so that a store statement stops between taking its snapshot
// and locking the row, and let another store call land in that gap. Each
// such interleaving is one that a plain single statement would get wrong.

// shareLock locks the row of k FOR SHARE in a transaction that stays open
// until the returned release is called (it commits). It returns the
// backend's pid.
func shareLock(t *testing.T, pool *pgxpool.Pool, schema string, k idemstore.Key) (pid uint32, release func()) {
	t.Helper()
	ctx := t.Context()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	err = tx.QueryRow(ctx, "SELECT pg_backend_pid() FROM "+pgx.Identifier{schema, "idem_records"}.Sanitize()+
		" WHERE scope = $1 AND operation = $2 AND key = $3 FOR SHARE", k.Scope, k.Operation, k.Key).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid, func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitBlockedBy returns once some backend waits for a lock that pid holds.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var blocked bool
		err := pool.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))", pid).Scan(&blocked)
		if err != nil {
			t.Fatal(err)
		}
		if blocked {
			return
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal("nothing blocked on the share lock")
		}
	}
}

// TestNotifyWaiterSubscribedWhileCompleting subscribes after Complete took
// its snapshot but before it locked the row: the waiter must still be
// woken.
func TestNotifyWaiterSubscribedWhileCompleting(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{})
	ctx := t.Context()
	k := reserveKey(t, s, "k")
	pid, release := shareLock(t, pool, schema, k)

	done := make(chan error, 1)
	go func() {
		done <- s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok-k", Response: &idemstore.Response{Status: 200}, Retention: time.Hour})
	}()
	waitBlockedBy(t, pool, pid) // Complete has its snapshot and waits for the row
	woken := subscribe(t, s, k) // a share lock too: it does not wait
	select {
	case <-woken:
		t.Fatal("woken before the record changed")
	default:
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("Complete: %v", err)
	}
	waitWake(t, woken, "the waiter that subscribed while Complete waited for the row")
}

// TestExtendWhileRecoveryWaits extends an expired lease after a recovery
// change (Takeover, or Release or Escalate with IfExpired) started but
// before it locked the row: the heartbeat landed first, so the recovery
// change must be refused.
func TestExtendWhileRecoveryWaits(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{})
	for _, tc := range []struct {
		name    string
		recover func(ctx context.Context, k idemstore.Key, token string) error
	}{
		{"Takeover", func(ctx context.Context, k idemstore.Key, token string) error {
			return s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: token, NewToken: "new-" + token, Lease: time.Hour})
		}},
		{"ReleaseIfExpired", func(ctx context.Context, k idemstore.Key, token string) error {
			return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: token, IfExpired: true})
		}},
		{"EscalateIfExpired", func(ctx context.Context, k idemstore.Key, token string) error {
			return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: token, Reason: "expired", IfExpired: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			k := idemstore.Key{Scope: "tenant", Operation: "POST /orders", Key: tc.name}
			token := "tok-" + tc.name
			if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: token, Lease: -time.Minute}); err != nil {
				t.Fatal(err)
			}
			pid, release := shareLock(t, pool, schema, k)
			done := make(chan error, 1)
			go func() { done <- tc.recover(ctx, k, token) }()
			waitBlockedBy(t, pool, pid)
			if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: token, Lease: time.Hour}); err != nil {
				t.Fatalf("Extend while %s waits: %v", tc.name, err)
			}
			release()
			if err := <-done; !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("%s after the lease was extended = %v, want ErrLeaseLost", tc.name, err)
			}
			got, err := s.Get(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != idemstore.StatePending || got.Token != token || got.LeaseExpired() {
				t.Fatalf("after the refused %s: %s, token %q, lease until %v read at %v; want the extended lease", tc.name, got.State, got.Token, got.LeaseUntil, got.ReadAt)
			}
		})
	}
}
