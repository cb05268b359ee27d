package idempg_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
)

// TestMigrateConcurrently runs several migrators on one new schema at once:
// the advisory lock must let each migration apply exactly once, and a later
// Migrate must be a no-op.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	ctx := t.Context()
	schema := "idem_t_" + randomHex(6)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = idempg.Migrate(ctx, pool, idempg.Config{Schema: schema}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migrator %d: %v", i, err)
		}
	}
	if err := idempg.Migrate(ctx, pool, idempg.Config{Schema: schema}); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var n, distinct int
	err := pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT version) FROM "+pgx.Identifier{schema, "idem_schema_migrations"}.Sanitize()).Scan(&n, &distinct)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || n != distinct {
		t.Fatalf("idem_schema_migrations has %d rows for %d versions", n, distinct)
	}
	// New with Migrate on an already migrated schema works too.
	s, err := idempg.New(pool, idempg.Config{Schema: schema, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
}

// TestMigrateKeepsExistingRows writes a record with the first schema
// version only, as a store of the previous release did, migrates, and uses
// it: UpdatedAt reads as CreatedAt, Request as none, and the record can be
// extended and completed.
func TestMigrateKeepsExistingRows(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	ctx := t.Context()
	schema := "idem_t_" + randomHex(6)
	quoted := pgx.Identifier{schema}.Sanitize()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+quoted+" CASCADE")
	})
	first, err := os.ReadFile("migrations/001_create_idem_records.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE SCHEMA " + quoted,
		strings.ReplaceAll(string(first), "{schema}", quoted),
		"CREATE TABLE " + quoted + ".idem_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
		"INSERT INTO " + quoted + ".idem_schema_migrations (version, name) VALUES (1, '001_create_idem_records')",
		"INSERT INTO " + quoted + `.idem_records (scope, operation, key, fingerprint, state, token, lease_until, created_at)
VALUES ('tenant', 'POST /orders', 'old', 'fp', 'pending', 'tok-old', now() + interval '1 minute', now() - interval '1 second')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	s, err := idempg.New(pool, idempg.Config{Schema: schema, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /orders", Key: "old"}
	rec, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.UpdatedAt.Equal(rec.CreatedAt) || rec.Request != nil || rec.State != idemstore.StatePending {
		t.Fatalf("old record after migrating: UpdatedAt %v CreatedAt %v Request %+v state %s; want UpdatedAt = CreatedAt, no request, pending",
			rec.UpdatedAt, rec.CreatedAt, rec.Request, rec.State)
	}
	if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok-old", Lease: time.Hour}); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok-old", Response: &idemstore.Response{Status: 201}, Retention: time.Hour}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if rec, err = s.Get(ctx, k); err != nil || rec.State != idemstore.StateCompleted || !rec.UpdatedAt.After(rec.CreatedAt) {
		t.Fatalf("after Complete: %+v, %v", rec, err)
	}
}
