package idemmysql_test

import (
	"errors"
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
	now := time.Now().UTC()
	k := idemstore.Key{
		Scope:     strings.Repeat("s", idemmysql.MaxScopeLen),
		Operation: strings.Repeat("o", idemmysql.MaxOperationLen),
		Key:       strings.Repeat("k", idemmysql.MaxKeyLen),
	}
	rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", LeaseUntil: now.Add(time.Minute), Now: now})
	if err != nil || !created || rec != nil {
		t.Fatalf("Reserve of the longest key = %v, %v, %v", rec, created, err)
	}
	if got, err := s.Get(ctx, k); err != nil || got.Key != k {
		t.Fatalf("Get of the longest key: %v", err)
	}
	k.Key += "k"
	_, _, err = s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", LeaseUntil: now.Add(time.Minute), Now: now})
	if err == nil || !strings.Contains(err.Error(), "key is 256 bytes") {
		t.Fatalf("Reserve of an over-long key = %v, want a clear error", err)
	}
}

// TestExtendToSameDeadline: MySQL reports zero changed rows for an UPDATE
// that changes nothing; that must not look like a lost lease.
func TestExtendToSameDeadline(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, "")
	ctx := t.Context()
	now := time.Now().UTC()
	k := idemstore.Key{Scope: "s", Operation: "o", Key: "k"}
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", LeaseUntil: now.Add(time.Minute), Now: now}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", LeaseUntil: now.Add(2 * time.Minute), Now: now}); err != nil {
			t.Fatalf("Extend #%d: %v", i+1, err)
		}
	}
	if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "other", LeaseUntil: now.Add(2 * time.Minute), Now: now}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Extend with a wrong token = %v, want ErrLeaseLost", err)
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
