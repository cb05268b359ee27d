package idempg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// reserveKey reserves name with token "tok-"+name and a lease of a minute.
func reserveKey(t *testing.T, s *idempg.Store, name string) idemstore.Key {
	t.Helper()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /orders", Key: name}
	if _, created, err := s.Reserve(t.Context(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok-" + name, Lease: time.Minute}); err != nil || !created {
		t.Fatalf("Reserve(%s) = %v, %v", name, created, err)
	}
	return k
}

func subscribe(t *testing.T, s *idempg.Store, k idemstore.Key) <-chan struct{} {
	t.Helper()
	ch, cancel, err := s.Subscribe(t.Context(), k)
	if err != nil {
		t.Fatalf("Subscribe(%v): %v", k, err)
	}
	t.Cleanup(cancel)
	return ch
}

// wakeBound bounds how long waitWake waits. It is a guard against hanging,
// not a latency requirement.
const wakeBound = 10 * time.Second

func waitWake(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wakeBound):
		t.Fatalf("no wake-up for %s within %v", what, wakeBound)
	}
}

// TestNotifyAtCommit shows that CompleteTx's notification is sent at the
// caller's commit, not before: NOTIFYs reach listeners in commit order, so
// once a later-committed change has been seen, an uncommitted one cannot
// have been.
func TestNotifyAtCommit(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s := newStore(t, pool, idempg.Config{})
	ctx := t.Context()
	a := reserveKey(t, s, "a")
	b := reserveKey(t, s, "b")
	wakeA, wakeB := subscribe(t, s, a), subscribe(t, s, b)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	lease := txLease{key: a, token: "tok-a"}
	if err := s.CompleteTx(ctx, tx, lease, &idemstore.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: b, Token: "tok-b", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wakeB, "b")
	select {
	case <-wakeA:
		t.Fatal("a was announced before its transaction committed")
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wakeA, "a after commit")
}

// TestNotifyListenerDropWakesAll terminates the listening connection: every
// subscriber must be woken (to poll), and the store must listen again.
func TestNotifyListenerDropWakesAll(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{ListenerRetry: 100 * time.Millisecond})
	ctx := t.Context()
	a := reserveKey(t, s, "a")
	wakeA := subscribe(t, s, a)

	var n int
	err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1`,
		`LISTEN "idem_`+schema+`"`).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminating the listener: %d backends, %v", n, err)
	}
	waitWake(t, wakeA, "a after the listener dropped")

	// It reconnects; a fresh subscription hears the next change.
	for {
		ch, cancel, err := s.Subscribe(ctx, a)
		if errors.Is(err, idemstore.ErrUnavailable) {
			select { // reconnecting: wait for the next attempt
			case <-time.After(50 * time.Millisecond):
				continue
			case <-ctx.Done():
				t.Fatal(err)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		// Drain the wake-up that the reconnect itself sends.
		select {
		case <-ch:
		default:
		}
		if err := s.Release(ctx, idemstore.ReleaseParams{Key: a, Token: "tok-a"}); err != nil {
			t.Fatal(err)
		}
		waitWake(t, ch, "a after reconnect")
		return
	}
}

func TestSubscribeUnavailable(t *testing.T) {
	t.Parallel()
	s, err := idempg.New(closedPortPool(t), idempg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, _, err = s.Subscribe(t.Context(), idemstore.Key{Scope: "s", Operation: "o", Key: "k"})
	if !errors.Is(err, idemstore.ErrUnavailable) {
		t.Fatalf("Subscribe on an unreachable server = %v, want ErrUnavailable", err)
	}
}

func TestSubscribeDisabled(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{DisableNotify: true})
	if s.Capabilities().Notify {
		t.Error("Capabilities().Notify with DisableNotify")
	}
	if _, _, err := s.Subscribe(t.Context(), idemstore.Key{Key: "k"}); err == nil {
		t.Error("Subscribe with DisableNotify succeeded")
	}
	// Fenced changes still work without the notify tail.
	k := reserveKey(t, s, "k")
	if err := s.Complete(t.Context(), idemstore.CompleteParams{Key: k, Token: "tok-k", Retention: time.Hour, Response: &idemstore.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(t.Context(), idemstore.ReleaseParams{Key: k, Token: "tok-k"}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Release after Complete = %v, want ErrLeaseLost", err)
	}
}

// TestCloseStopsListener must not run in parallel: goleak compares the
// goroutines before and after.
func TestCloseStopsListener(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-registered first: the schema is dropped, then the
	// pool closed, then goroutines compared.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(t, pool, idempg.Config{})
	k := reserveKey(t, s, "k")
	ch := subscribe(t, s, k)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, "subscriber at Close")
	if _, _, err := s.Subscribe(t.Context(), k); err == nil {
		t.Fatal("Subscribe after Close succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
