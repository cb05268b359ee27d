package idempg_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idempg"
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
