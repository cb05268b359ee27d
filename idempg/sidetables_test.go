package idempg_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// sideRows counts the heartbeat and waiter rows of k.
func sideRows(t *testing.T, pool *pgxpool.Pool, schema string, k idemstore.Key) (leases, waiters int) {
	t.Helper()
	err := pool.QueryRow(t.Context(), `SELECT
    (SELECT count(*) FROM `+pgx.Identifier{schema, "idem_leases"}.Sanitize()+` WHERE scope = $1 AND operation = $2 AND key = $3),
    (SELECT count(*) FROM `+pgx.Identifier{schema, "idem_waiters"}.Sanitize()+` WHERE scope = $1 AND operation = $2 AND key = $3)`,
		k.Scope, k.Operation, k.Key).Scan(&leases, &waiters)
	if err != nil {
		t.Fatal(err)
	}
	return leases, waiters
}

// TestShortenedLeaseExpires shortens a live lease with a heartbeat of a
// negative lease: the heartbeat's deadline, earlier than the record's own,
// is the one that counts everywhere.
func TestShortenedLeaseExpires(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	ctx := t.Context()
	k := reserveKey(t, s, "k")
	if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok-k", Lease: -time.Minute}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.LeaseExpired() {
		t.Fatalf("lease until %v read at %v: not expired after a negative heartbeat", rec.LeaseUntil, rec.ReadAt)
	}
	recs, err := s.ListExpiredLeases(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Key != k || !recs[0].LeaseUntil.Equal(rec.LeaseUntil) {
		t.Fatalf("ListExpiredLeases = %v; want the shortened lease of %v until %v", recs, k, rec.LeaseUntil)
	}
	if err := s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "tok-k", NewToken: "tok-new", Lease: time.Hour}); err != nil {
		t.Fatalf("Takeover of the shortened lease: %v", err)
	}
	// The old heartbeat no longer counts: the new lease is the record's.
	if rec, err = s.Get(ctx, k); err != nil || rec.Token != "tok-new" || rec.LeaseExpired() {
		t.Fatalf("after Takeover: %+v, %v", rec, err)
	}
	if recs, err = s.ListExpiredLeases(ctx, 10); err != nil || len(recs) != 0 {
		t.Fatalf("ListExpiredLeases after Takeover = %v, %v; want none", recs, err)
	}
}

// TestSideRowsGoWithTheRecord checks that the heartbeat and waiter rows of
// a key are deleted with its record, whichever way it goes.
func TestSideRowsGoWithTheRecord(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{})
	ctx := t.Context()
	resp := &idemstore.Response{Status: 201}
	for _, tc := range []struct {
		name string
		end  func(k idemstore.Key) error
	}{
		{"Release", func(k idemstore.Key) error {
			return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok-" + k.Key})
		}},
		{"ReleaseIfExpired", func(k idemstore.Key) error {
			if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok-" + k.Key, Lease: -time.Minute}); err != nil {
				return err
			}
			return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok-" + k.Key, IfExpired: true})
		}},
		{"ResolveRelease", func(k idemstore.Key) error {
			if err := s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok-" + k.Key, Reason: "r"}); err != nil {
				return err
			}
			return s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveRelease})
		}},
		{"Delete", func(k idemstore.Key) error {
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok-" + k.Key, Response: resp, Retention: time.Hour}); err != nil {
				return err
			}
			return s.Delete(ctx, idemstore.DeleteParams{Key: k, Token: "tok-" + k.Key})
		}},
		{"Purge", func(k idemstore.Key) error {
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok-" + k.Key, Response: resp, Retention: -time.Hour}); err != nil {
				return err
			}
			_, err := s.Purge(ctx, idemstore.PurgeParams{})
			return err
		}},
	} {
		k := reserveKey(t, s, tc.name)
		if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok-" + k.Key, Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
		subscribe(t, s, k)
		if l, w := sideRows(t, pool, schema, k); l != 1 || w != 1 {
			t.Fatalf("%s: before: %d heartbeat and %d waiter rows, want 1 and 1", tc.name, l, w)
		}
		if err := tc.end(k); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := s.Get(ctx, k); err == nil {
			t.Fatalf("%s: the record is still there", tc.name)
		}
		if l, w := sideRows(t, pool, schema, k); l != 0 || w != 0 {
			t.Fatalf("%s: after: %d heartbeat and %d waiter rows, want none", tc.name, l, w)
		}
	}
}
