package idempg

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// awReserve reserves a key named name in s under the token "tok-"+name.
func awReserve(t *testing.T, s *Store, name string) idemstore.Key {
	t.Helper()
	k := idemstore.Key{Scope: "aw", Operation: "POST /orders", Key: name}
	if _, created, err := s.Reserve(t.Context(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok-" + k.Key, Lease: time.Minute}); err != nil || !created {
		t.Fatalf("Reserve %s: created %t, %v", name, created, err)
	}
	return k
}

// awCompleteBatch completes keys (reserved by awReserve) in one batch of
// s, with one completeMany, and fails t unless every one is completed.
func awCompleteBatch(t *testing.T, s *Store, keys ...idemstore.Key) {
	t.Helper()
	var ops []*groupcommit.Op
	for _, k := range keys {
		ops = append(ops, &groupcommit.Op{Kind: groupcommit.Complete, Key: k, Token: "tok-" + k.Key,
			Response: &idemstore.Response{Status: 201}, Retention: time.Hour})
	}
	if err := s.runBatch(t.Context(), ops); err != nil {
		t.Fatalf("batch: %v", err)
	}
	for i, op := range ops {
		if op.Err != nil {
			t.Fatalf("Complete %s in the batch: %v", keys[i].Key, op.Err)
		}
		rec, err := s.Get(t.Context(), keys[i])
		if err != nil || rec == nil || rec.State != idemstore.StateCompleted {
			t.Fatalf("%s after the batch: %+v, %v", keys[i].Key, rec, err)
		}
	}
}

// awSubscribe subscribes to k and returns the wake-up channel.
func awSubscribe(t *testing.T, s *Store, k idemstore.Key) <-chan struct{} {
	t.Helper()
	ch, cancel, err := s.Subscribe(t.Context(), k)
	if err != nil {
		t.Fatalf("Subscribe %s: %v", k.Key, err)
	}
	t.Cleanup(cancel)
	return ch
}

// awWoken fails t unless ch fires (a generous bound, for a hang only).
// awStore returns a pool, a schema migrated up to version and a store on
// it, closed when the test ends.
func awStore(t *testing.T, version int) (*pgxpool.Pool, string, *Store) {
	t.Helper()
	pool := oaPool(t, 8)
	schema := oaSchemaAt(t, pool, version)
	s, err := New(pool, Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return pool, schema, s
}

func awWoken(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no wake-up for %s", what)
	}
}

// TestAwaitedSchemaAt005: a store on a schema migrated only to 005 (no
// idem_awaited) completes a batch's records with the per-record check and
// wakes their waiters; migrated to 006 meanwhile, it keeps doing so, and a
// store made after the migration checks once.
func TestAwaitedSchemaAt005(t *testing.T) {
	pool, schema, s := awStore(t, 5)
	ctx := context.Background()
	a, b, c := awReserve(t, s, "a"), awReserve(t, s, "b"), awReserve(t, s, "c")
	woken := awSubscribe(t, s, b)
	awCompleteBatch(t, s, a, b, c)
	awWoken(t, woken, "b's waiter, schema at 005")
	if got := s.awaited.Load(); got != awaitedNo {
		t.Fatalf("awaited %d on a schema at 005, want %d (per record)", got, awaitedNo)
	}

	if err := Migrate(ctx, pool, Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	if v := oaVersions(t, pool, schema); !slices.Equal(v, []int32{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("versions %v after Migrate", v)
	}
	d, e := awReserve(t, s, "d"), awReserve(t, s, "e")
	woken = awSubscribe(t, s, e)
	awCompleteBatch(t, s, d, e)
	awWoken(t, woken, "e's waiter, store made before migration 006")
	if got := s.awaited.Load(); got != awaitedNo {
		t.Fatalf("awaited %d after the migration, want %d: a store keeps what it read", got, awaitedNo)
	}

	s2, err := New(pool, Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	f, g := awReserve(t, s2, "f"), awReserve(t, s2, "g")
	woken = awSubscribe(t, s2, f)
	awCompleteBatch(t, s2, f, g)
	awWoken(t, woken, "f's waiter, store made after migration 006")
	if got := s2.awaited.Load(); got != awaitedYes {
		t.Fatalf("awaited %d for a store made after migration 006, want %d", got, awaitedYes)
	}
}

// TestAwaitedOncePerStatement counts, with track_functions, the calls of
// idem_awaited and idem_wake that completeMany makes for three records:
// with migration 006, one idem_awaited and no idem_wake while no key is
// awaited, one idem_awaited and an idem_wake per record once one is; the
// per-record statement calls idem_wake per record.
func TestAwaitedOncePerStatement(t *testing.T) {
	pool, schema, s := awStore(t, 1<<30)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if got := s.completeManySQL(ctx, conn); got != s.q.completeManyAwaited {
		t.Fatalf("the store on a schema with migration 006 completes with\n%s", got)
	}
	// complete runs sql for keys in a transaction of its own and returns
	// how many times it called each function.
	complete := func(sql string, keys ...idemstore.Key) (awaited, wake int64) {
		t.Helper()
		var ops []*groupcommit.Op
		for _, k := range keys {
			ops = append(ops, &groupcommit.Op{Kind: groupcommit.Complete, Key: k, Token: "tok-" + k.Key, Retention: time.Hour})
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL track_functions = 'pl'"); err != nil {
				return err
			}
			// The view counts this backend's calls not yet reported,
			// which may include earlier transactions': the difference.
			const calls = `SELECT
    COALESCE(sum(calls) FILTER (WHERE funcname = 'idem_awaited'), 0), COALESCE(sum(calls) FILTER (WHERE funcname = 'idem_wake'), 0)
FROM pg_stat_xact_user_functions WHERE schemaname = $1`
			var awaited0, wake0 int64
			if err := tx.QueryRow(ctx, calls, schema).Scan(&awaited0, &wake0); err != nil {
				return err
			}
			rows, _ := tx.Query(ctx, sql, s.completeArrays(ops)...)
			done, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (int64, error) {
				var n int64
				return n, row.Scan(&n, nil)
			})
			if err != nil {
				return err
			}
			if len(done) != len(keys) {
				t.Errorf("completed %v of %d", done, len(keys))
			}
			if err := tx.QueryRow(ctx, calls, schema).Scan(&awaited, &wake); err != nil {
				return err
			}
			awaited, wake = awaited-awaited0, wake-wake0
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return awaited, wake
	}
	if aw, wk := complete(s.q.completeManyAwaited, awReserve(t, s, "a"), awReserve(t, s, "b"), awReserve(t, s, "c")); aw != 1 || wk != 0 {
		t.Errorf("no key awaited: idem_awaited called %d times, idem_wake %d; want 1 and 0", aw, wk)
	}
	d, e, f := awReserve(t, s, "d"), awReserve(t, s, "e"), awReserve(t, s, "f")
	woken := awSubscribe(t, s, e)
	if aw, wk := complete(s.q.completeManyAwaited, d, e, f); aw != 1 || wk != 3 {
		t.Errorf("e awaited: idem_awaited called %d times, idem_wake %d; want 1 and 3", aw, wk)
	}
	awWoken(t, woken, "e's waiter")
	if aw, wk := complete(s.q.completeMany, awReserve(t, s, "g"), awReserve(t, s, "h"), awReserve(t, s, "i")); aw != 0 || wk != 3 {
		t.Errorf("per record: idem_awaited called %d times, idem_wake %d; want 0 and 3", aw, wk)
	}
}

// TestAwaitedProbeFailsOnce: a store that cannot read the schema's
// migrations at its first batch of completions (here the table is
// renamed away for that batch) completes that batch with the per-record
// check, wakes its waiter, and fails nothing; it reads again at the next
// batch, which then checks once.
func TestAwaitedProbeFailsOnce(t *testing.T) {
	pool, schema, s := awStore(t, 6)
	ctx := context.Background()
	table := pgx.Identifier{schema, "idem_schema_migrations"}.Sanitize()
	moved := pgx.Identifier{schema, "idem_schema_migrations_away"}.Sanitize()
	if _, err := pool.Exec(ctx, "ALTER TABLE "+table+" RENAME TO idem_schema_migrations_away"); err != nil {
		t.Fatal(err)
	}
	a, b := awReserve(t, s, "a"), awReserve(t, s, "b")
	woken := awSubscribe(t, s, b)
	awCompleteBatch(t, s, a, b)
	awWoken(t, woken, "b's waiter, the migrations unreadable")
	if got := s.awaited.Load(); got != awaitedUnknown {
		t.Fatalf("awaited %d after a failed read of the migrations, want %d (read again)", got, awaitedUnknown)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE "+moved+" RENAME TO idem_schema_migrations"); err != nil {
		t.Fatal(err)
	}
	c, d := awReserve(t, s, "c"), awReserve(t, s, "d")
	woken = awSubscribe(t, s, d)
	awCompleteBatch(t, s, c, d)
	awWoken(t, woken, "d's waiter, the migrations read")
	if got := s.awaited.Load(); got != awaitedYes {
		t.Fatalf("awaited %d once the migrations could be read, want %d", got, awaitedYes)
	}
}
