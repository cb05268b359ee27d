package idemmysql_test

import (
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
)

// TestLongestKeyFits reserves a key at every column limit (the primary key
// must fit InnoDB's index limit) and rejects one byte more.
func TestLongestKeyFits(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, "")
	ctx := t.Context()
	k := idemstore.Key{
		Scope:     strings.Repeat("s", idemmysql.MaxScopeLen),
		Operation: strings.Repeat("o", idemmysql.MaxOperationLen),
		Key:       strings.Repeat("k", idemmysql.MaxKeyLen),
	}
	rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute})
	if err != nil || !created || rec != nil {
		t.Fatalf("Reserve of the longest key = %v, %v, %v", rec, created, err)
	}
	if got, err := s.Get(ctx, k); err != nil || got.Key != k {
		t.Fatalf("Get of the longest key: %v", err)
	}
	k.Key += "k"
	_, _, err = s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "key is 256 bytes") {
		t.Fatalf("Reserve of an over-long key = %v, want a clear error", err)
	}
}

// TestServerClock stops the server's clock in a session time zone that is
// not UTC: every time the store writes or reads is that clock, to the
// millisecond, plus the duration given.
func TestServerClock(t *testing.T) {
	t.Parallel()
	s, _ := newFrozenStore(t, frozenClock, "+05:30")
	ctx := t.Context()
	now := frozenClock.Truncate(time.Millisecond)
	k := idemstore.Key{Scope: "s", Operation: "o", Key: "k"}
	reserve(t, s, k, "tok", 90*time.Second)
	rec := get(t, s, k)
	for name, got := range map[string]time.Time{
		"CreatedAt": rec.CreatedAt, "UpdatedAt": rec.UpdatedAt, "ReadAt": rec.ReadAt, "LeaseUntil - 90s": rec.LeaseUntil.Add(-90 * time.Second),
	} {
		if !got.Equal(now) || got.Location() != time.UTC {
			t.Errorf("%s = %v, want the server's clock %v in UTC", name, got, now)
		}
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 200}, Retention: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if rec := get(t, s, k); !rec.ExpiresAt.Equal(now.Add(24 * time.Hour)) {
		t.Errorf("ExpiresAt = %v, want %v", rec.ExpiresAt, now.Add(24*time.Hour))
	}
}

// TestExtendInTheSameMillisecond: two Extends that compute the same
// deadline write the same values, and MySQL reports zero changed rows for
// the second; that must not look like a lost lease. (Stopping the server's
// clock makes every Extend land in one millisecond.)
func TestExtendInTheSameMillisecond(t *testing.T) {
	t.Parallel()
	s, _ := newFrozenStore(t, frozenClock, "")
	ctx := t.Context()
	k := idemstore.Key{Scope: "s", Operation: "o", Key: "k"}
	reserve(t, s, k, "tok", time.Minute)
	for i := range 3 {
		if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", Lease: 2 * time.Minute}); err != nil {
			t.Fatalf("Extend #%d: %v", i+1, err)
		}
	}
	if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "other", Lease: 2 * time.Minute}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Extend with a wrong token = %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", Lease: 2 * time.Minute}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Extend of a completed record = %v, want ErrLeaseLost", err)
	}
}

// TestExpiryBoundary judges leases and retention at the server's clock to
// the millisecond: a deadline equal to now has passed, one a millisecond
// later has not.
func TestExpiryBoundary(t *testing.T) {
	t.Parallel()
	s, _ := newFrozenStore(t, frozenClock, "")
	ctx := t.Context()
	key := func(name string) idemstore.Key { return idemstore.Key{Scope: "s", Operation: "o", Key: name} }
	for _, name := range []string{"takeover", "release", "escalate"} {
		reserve(t, s, key(name+"-alive"), "tok", time.Millisecond)
		reserve(t, s, key(name+"-now"), "tok", 0)
	}
	expired, err := s.ListExpiredLeases(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rec := range expired {
		names = append(names, rec.Key.Key)
	}
	slices.Sort(names)
	if want := []string{"escalate-now", "release-now", "takeover-now"}; !slices.Equal(names, want) {
		t.Fatalf("ListExpiredLeases = %q, want the leases that end now, %q", names, want)
	}
	acts := map[string]func(k idemstore.Key) error{
		"takeover": func(k idemstore.Key) error {
			return s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "tok", NewToken: "tok-2", Lease: time.Minute})
		},
		"release": func(k idemstore.Key) error {
			return s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok", IfExpired: true})
		},
		"escalate": func(k idemstore.Key) error {
			return s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok", Reason: "expired", IfExpired: true})
		},
	}
	for name, act := range acts {
		if err := act(key(name + "-alive")); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("%s of a lease that ends a millisecond from now = %v, want ErrLeaseLost", name, err)
		}
		if err := act(key(name + "-now")); err != nil {
			t.Errorf("%s of a lease that ends now: %v", name, err)
		}
	}

	for name, retention := range map[string]time.Duration{"purge-now": 0, "purge-alive": time.Millisecond} {
		reserve(t, s, key(name), "tok", time.Minute)
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: key(name), Token: "tok", Response: &idemstore.Response{Status: 200}, Retention: retention}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Purge(ctx, idemstore.PurgeParams{}); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want the one record whose retention ends now", n, err)
	}
	if _, err := s.Get(ctx, key("purge-alive")); err != nil {
		t.Fatalf("the record retained a millisecond longer: %v", err)
	}
}

// TestMigrateConcurrently runs several migrators on one new database at
// once: GET_LOCK must let each migration apply exactly once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	db, _ := newDatabase(t, "") // already migrated once; drop and redo
	ctx := t.Context()
	for _, stmt := range []string{"DROP TABLE idem_records", "DROP TABLE idem_schema_migrations"} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = idemmysql.Migrate(ctx, db, idemmysql.Config{}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migrator %d: %v", i, err)
		}
	}
	var n, distinct int
	if err := db.QueryRowContext(ctx, "SELECT count(*), count(DISTINCT version) FROM idem_schema_migrations").Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n == 0 || n != distinct {
		t.Fatalf("idem_schema_migrations has %d rows for %d versions", n, distinct)
	}
	if _, err := idemmysql.New(db, idemmysql.Config{Migrate: true}); err != nil {
		t.Fatalf("New with Migrate on a migrated database: %v", err)
	}
}

// TestMigrateKeepsOldRows writes a record the way the first schema did,
// then migrates: the record reads with UpdatedAt = CreatedAt and no
// Request, and changes to it set UpdatedAt.
func TestMigrateKeepsOldRows(t *testing.T) {
	t.Parallel()
	db, _ := newDatabase(t, "")
	ctx := t.Context()
	first, err := os.ReadFile("migrations/001_create_idem_records.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{"DROP TABLE idem_records", "DELETE FROM idem_schema_migrations WHERE version > 1",
		strings.TrimSuffix(strings.TrimSpace(string(first)), ";"),
		"INSERT INTO idem_records (scope, operation, `key`, fingerprint, state, token, lease_until, reason, created_at) " +
			"VALUES ('s', 'o', 'k', 'fp', 'pending', 'tok', 1792888260123, '', 1792888200123)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%.40s: %v", stmt, err)
		}
	}
	s, err := idemmysql.New(db, idemmysql.Config{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	k := idemstore.Key{Scope: "s", Operation: "o", Key: "k"}
	rec := get(t, s, k)
	if !rec.CreatedAt.Equal(frozenClock) || !rec.UpdatedAt.Equal(rec.CreatedAt) || rec.Request != nil || !rec.LeaseUntil.Equal(frozenClock.Add(time.Minute)) {
		t.Fatalf("old record reads CreatedAt %v UpdatedAt %v LeaseUntil %v Request %+v", rec.CreatedAt, rec.UpdatedAt, rec.LeaseUntil, rec.Request)
	}
	if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if rec := get(t, s, k); !rec.UpdatedAt.After(rec.CreatedAt) || rec.UpdatedAt.After(rec.ReadAt) {
		t.Fatalf("after Extend: UpdatedAt %v, CreatedAt %v, ReadAt %v", rec.UpdatedAt, rec.CreatedAt, rec.ReadAt)
	}
}

// TestListByOperationAfterAnyCursor pages by operation from cursors on
// keys of the same, an earlier and a later operation: every page holds
// exactly the operation's keys after the cursor, in key order. (The driver
// writes the cursor condition differently in each case.)
func TestListByOperationAfterAnyCursor(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, "")
	ctx := t.Context()
	var all []idemstore.Key // in primary-key order
	for _, scope := range []string{"s1", "s2", "s3"} {
		for _, op := range []string{"a", "b", "c"} {
			for _, key := range []string{"k1", "k2"} {
				k := idemstore.Key{Scope: scope, Operation: op, Key: key}
				reserve(t, s, k, "tok", time.Minute)
				all = append(all, k)
			}
		}
	}
	less := func(a, b idemstore.Key) bool {
		return a.Scope < b.Scope || a.Scope == b.Scope && (a.Operation < b.Operation || a.Operation == b.Operation && a.Key < b.Key)
	}
	for _, after := range []idemstore.Key{
		{Scope: "s2", Operation: "b", Key: "k1"},
		{Scope: "s2", Operation: "a", Key: "k9"},
		{Scope: "s2", Operation: "c", Key: ""},
		{Scope: "s0", Operation: "z", Key: "k1"},
	} {
		var want, got []idemstore.Key
		for _, k := range all {
			if k.Operation == "b" && less(after, k) {
				want = append(want, k)
			}
		}
		cursor := idemstore.EncodeKeyCursor(after)
		for {
			page, err := s.List(ctx, idemstore.ListParams{Operation: "b", State: idemstore.StatePending, Cursor: cursor, Limit: 2})
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range page.Records {
				got = append(got, rec.Key)
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("after %v: listed %v, want %v", after, got, want)
		}
	}
}
