package idempg

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
)

// TestOpenRecordsIndex checks that the index of states holds only pending
// and needs_review records, and that the statements which read open
// records can use it as prepared statements: pgx prepares every statement,
// and after five runs PostgreSQL may keep a generic plan, which knows
// nothing of a parameter's value and so can use a partial index only when
// the statement itself implies the index's predicate.
func TestOpenRecordsIndex(t *testing.T) {
	ctx := context.Background()
	pool := oaPool(t, 4)
	schema := migratedSchema(t, pool)
	rows, _ := pool.Query(ctx, `SELECT indexname || ': ' || indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = 'idem_records' ORDER BY indexname`, schema)
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(indexes, "\n")
	if strings.Contains(all, "idem_records_state_key") {
		t.Errorf("the index of every record's state is still there:\n%s", all)
	}
	if !strings.Contains(all, "idem_records_open_key") || !strings.Contains(all, "WHERE (state <> 'completed'::text)") {
		t.Fatalf("no partial index of open records:\n%s", all)
	}

	s, err := New(pool, Config{Schema: schema, DisableBatch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A generic plan, as a prepared statement may get, and no sequential
	// scan, which an empty table would otherwise get.
	plan := func(t *testing.T, sql string, args ...any) string {
		t.Helper()
		return oaGenericPlan(t, pool, sql, args, "enable_seqscan = off")
	}
	for _, st := range []idemstore.State{idemstore.StatePending, idemstore.StateNeedsReview} {
		for _, order := range []idemstore.Order{idemstore.OrderKey, idemstore.OrderOldest} {
			p := idemstore.ListParams{State: st, Order: order, Limit: 50}.Normalize()
			sql, args := listQuery(s.q.list, p, nil)
			if got := plan(t, sql, args...); !strings.Contains(got, "idem_records_open_key") {
				t.Errorf("List of %s records in order %d does not read the index of open records:\n%s", st, order, got)
			}
		}
	}
	if got := plan(t, s.q.countOpen); !strings.Contains(got, "idem_records_open_key") {
		t.Errorf("Counts of open records does not read the index of open records:\n%s", got)
	}

}

// failedConcurrentIndex runs ddl, a CREATE INDEX CONCURRENTLY on table,
// while another transaction holds a write on it, with a short lock
// timeout: the build fails, as an operator's may, and leaves an invalid
// index under its name. It skips the test if the build did not fail.
func failedConcurrentIndex(t *testing.T, pool *pgxpool.Pool, table, ddl string) {
	t.Helper()
	ctx := context.Background()
	writer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Rollback(ctx) }()
	if _, err := writer.Exec(ctx, "INSERT INTO "+table+" (scope, operation, key, fingerprint, state, token, lease_until, created_at) VALUES ('w', 'op', 'w', 'fp', 'pending', 't', now(), now())"); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET lock_timeout = '300ms'"); err != nil {
		t.Fatal(err)
	}
	_, buildErr := conn.Exec(ctx, ddl)
	if _, err := conn.Exec(ctx, "RESET lock_timeout"); err != nil {
		t.Fatal(err)
	}
	if buildErr == nil {
		t.Skip("CREATE INDEX CONCURRENTLY did not fail: cannot set up an invalid index")
	}
}

// TestMigrateDropsOnlyInvalidIndexesItBuilds: before pending migrations
// run, Migrate drops an invalid index that one of them builds (so that it
// builds it), and leaves alone an invalid index that none builds, which it
// could not build again.
func TestMigrateDropsOnlyInvalidIndexesItBuilds(t *testing.T) {
	pool := oaPool(t, 4)
	ctx := context.Background()
	schema := oaSchemaAt(t, pool, 4)
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	failedConcurrentIndex(t, pool, table, "CREATE INDEX CONCURRENTLY idem_records_open_key ON "+table+" (state, scope, operation, key) WHERE state <> 'completed'")
	failedConcurrentIndex(t, pool, table, "CREATE INDEX CONCURRENTLY idem_records_operators_own ON "+table+" (updated_at)")
	before := oaIndexes(t, pool, schema)
	if before["idem_records_open_key"].valid || before["idem_records_operators_own"].valid {
		t.Fatalf("set-up: the failed builds left valid indexes: %+v", before)
	}
	if err := Migrate(ctx, pool, Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	after := oaIndexes(t, pool, schema)
	if ix, ok := after["idem_records_open_key"]; !ok || !ix.valid {
		t.Errorf("the index of open records after Migrate: %+v (present %t), want valid", ix, ok)
	}
	if ix, ok := after["idem_records_operators_own"]; !ok || ix.valid {
		t.Errorf("an invalid index that no migration builds: %+v (present %t) after Migrate, want left as it was", ix, ok)
	}
}

// migratedSchema creates a schema of its own through Migrate, dropped in
// cleanup, and returns its name.
func migratedSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	schema := fmt.Sprintf("idem_t_%d", time.Now().UnixNano())
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if err := Migrate(context.Background(), pool, Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	return schema
}
