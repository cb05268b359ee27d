package idempg

// Fault attacks on the upgrade to migration 005 and on Migrate's dropping
// of invalid indexes (dropInvalidIndexes): a Migrate whose context ends or
// whose backend is killed while it waits at each of its steps, an
// operator's CREATE INDEX CONCURRENTLY of the index of open records that
// runs while Migrate does, and stores, made before and after the upgrade,
// that must keep every answer and never hand a key out twice across it.
//
// Every wait is on a lock that the test holds and then releases; the test
// finds who waits in pg_locks, polling with a bound, never by sleeping.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
)

// fkApp returns an application_name of its own for one role in one test.
func fkApp(role string) string { return fmt.Sprintf("idem_fk_%s_%d", role, time.Now().UnixNano()) }

// fkAppPool returns a pool of its own (closed in cleanup) whose connections
// carry application_name app and the given settings, so that the test
// finds their backends in pg_stat_activity and pg_locks.
func fkAppPool(t *testing.T, app string, maxConns int32, settings map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg := oaPool(t, 1).Config()
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	for k, v := range settings {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// fkPoll runs cond every few milliseconds until it returns true (then
// fkPoll does) or within has passed (then false).
func fkPoll(t *testing.T, within time.Duration, cond func(ctx context.Context) (bool, error)) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil && ctx.Err() == nil {
			t.Fatalf("poll: %v", err)
		}
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// fkWaiter polls until a backend of app waits for a lock of mode (any
// mode when empty) on table, and returns its pid; it fails t after 5 s.
func fkWaiter(t *testing.T, pool *pgxpool.Pool, app, table, mode string) int32 {
	t.Helper()
	var pid int32
	if !fkPoll(t, 5*time.Second, func(ctx context.Context) (bool, error) {
		err := pool.QueryRow(ctx, `SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE a.application_name = $1 AND l.locktype = 'relation' AND l.relation = to_regclass($2)
  AND ($3 = '' OR l.mode = $3) AND NOT l.granted LIMIT 1`, app, table, mode).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	}) {
		t.Fatalf("no backend of %s came to wait for %s on %s within 5 s", app, mode, table)
	}
	return pid
}

// fkBusy returns what the backends of app that are not idle are doing.
func fkBusy(t *testing.T, pool *pgxpool.Pool, app string) []string {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `SELECT format('pid %s %s, waiting for %s %s: %s', pid, state,
    coalesce(wait_event_type, '-'), coalesce(wait_event, '-'), left(regexp_replace(query, '\s+', ' ', 'g'), 80))
FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'`, app)
	busy, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return busy
}

// fkGone polls until no backend of app is busy, up to within.
func fkGone(t *testing.T, pool *pgxpool.Pool, app string, within time.Duration) bool {
	t.Helper()
	return fkPoll(t, within, func(ctx context.Context) (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'`, app).Scan(&n)
		return n == 0, err
	})
}

// fkTx opens a transaction that runs sql and holds its locks until the
// returned end is called (commit true, else rollback); cleanup rolls it
// back if the test did not end it, before the schema is dropped.
func fkTx(t *testing.T, pool *pgxpool.Pool, sql string) (end func(commit bool)) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	var once sync.Once
	end = func(commit bool) {
		once.Do(func() {
			var err error
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Errorf("end of the test's transaction (%s): %v", sql, err)
			}
		})
	}
	t.Cleanup(func() { end(false) })
	return end
}

func fkWriterSQL(table string) string {
	return "INSERT INTO " + table + " (scope, operation, key, fingerprint, state, token, lease_until, created_at) VALUES ('fk-w', 'op', 'w', 'fp', 'pending', 't', now(), now())"
}

func fkBuildSQL(table string) string {
	return "CREATE INDEX CONCURRENTLY idem_records_open_key ON " + table + " (state, scope, operation, key) WHERE state <> 'completed'"
}

// fkGo runs f in a goroutine and returns a channel of its error.
func fkGo(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// fkResult waits up to within for ch.
func fkResult(t *testing.T, what string, ch <-chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(within):
		t.Fatalf("%s did not return within %v", what, within)
		return nil
	}
}

// fkStartBuild starts an operator's CREATE INDEX CONCURRENTLY of the index
// of open records on a connection of app (with a statement timeout, so
// that it ends even if the test fails), and returns what waits for its
// end, up to a bound, and returns its error.
func fkStartBuild(t *testing.T, admin *pgxpool.Pool, app, table string) (wait func(within time.Duration) error) {
	t.Helper()
	pool := fkAppPool(t, app, 1, map[string]string{"statement_timeout": "20s"})
	done := make(chan struct{})
	var buildErr error
	go func() {
		defer close(done)
		_, buildErr = pool.Exec(context.Background(), fkBuildSQL(table))
	}()
	// The pool's cleanup waits for the build's connection: end it first.
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app)
		<-done
	})
	return func(within time.Duration) error {
		select {
		case <-done:
			return buildErr
		case <-time.After(within):
			t.Fatalf("the operator's CREATE INDEX CONCURRENTLY did not end within %v: %q", within, fkBusy(t, admin, app))
			return nil
		}
	}
}

// fkOpenKey returns the oid and validity of schema's idem_records_open_key
// (oid 0 when there is none).
func fkOpenKey(t *testing.T, pool *pgxpool.Pool, schema string) (oid uint32, valid bool) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT i.indexrelid::oid, i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)`,
		pgx.Identifier{schema, "idem_records_open_key"}.Sanitize()).Scan(&oid, &valid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return oid, valid
}

// fkCheckAt4 fails t unless schema is exactly at version 4 with the index
// of states valid.
func fkCheckAt4(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	if v := oaVersions(t, pool, schema); !slices.Equal(v, []int32{1, 2, 3, 4}) {
		t.Errorf("versions %v after a failed Migrate, want [1 2 3 4]", v)
	}
	if ix, ok := oaIndexes(t, pool, schema)["idem_records_state_key"]; !ok || !ix.valid || !ix.ready {
		t.Errorf("after a failed Migrate the index of states is %+v (present %t), want it intact", ix, ok)
	}
}

// fkCheckConsistent fails t unless schema is either at version 4 with the
// index of states intact, or at the latest (5 and 6) with a valid index
// of open records: never the old index dropped without a new one that
// works.
func fkCheckConsistent(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	switch v := oaVersions(t, pool, schema); {
	case slices.Equal(v, []int32{1, 2, 3, 4}):
		fkCheckAt4(t, pool, schema)
	case slices.Equal(v, []int32{1, 2, 3, 4, 5, 6}):
		oaCheckOpenIndex(t, pool, schema)
	default:
		t.Errorf("versions %v", v)
	}
}

// fkKeys are the records a fault test writes through the store before it
// attacks the upgrade: an answer that must replay and a pending key.
type fkKeys struct{ done, pend idemstore.Key }

var fkAnswer = &idemstore.Response{Status: 201, Body: []byte(`{"charge":"ch_1"}`)}

func fkWrite(t *testing.T, s *Store) fkKeys {
	t.Helper()
	ctx := context.Background()
	k := fkKeys{
		done: idemstore.Key{Scope: "fk", Operation: "POST /charges", Key: "done"},
		pend: idemstore.Key{Scope: "fk", Operation: "POST /charges", Key: "pend"},
	}
	for _, key := range []idemstore.Key{k.done, k.pend} {
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key, Fingerprint: "fp", Token: "tok-" + key.Key, Lease: time.Minute}); err != nil || !created {
			t.Fatalf("Reserve %v: created %t, %v", key, created, err)
		}
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k.done, Token: "tok-done", Response: fkAnswer, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return k
}

// fkServes checks, each within a bound, that the store still replays the
// stored answer, refuses the pending key to a second holder and reserves
// a new key: what the engine does on every request.
func fkServes(t *testing.T, s *Store, k fkKeys, within time.Duration, tag string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	if rec, err := s.Get(ctx, k.done); err != nil {
		t.Errorf("%s: Get of a completed key: %v (after %v): its answer cannot be replayed", tag, err, time.Since(start).Round(time.Millisecond))
	} else if rec.Response == nil || string(rec.Response.Body) != string(fkAnswer.Body) {
		t.Errorf("%s: Get of a completed key: response %+v", tag, rec.Response)
	}
	ctx, cancel = context.WithTimeout(context.Background(), within)
	defer cancel()
	start = time.Now()
	rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k.pend, Fingerprint: "fp", Token: "second-" + tag, Lease: time.Minute})
	switch {
	case err != nil:
		t.Errorf("%s: Reserve of a pending key: %v (after %v)", tag, err, time.Since(start).Round(time.Millisecond))
	case created:
		t.Errorf("%s: Reserve of a key pending under another token acquired it: the operation runs twice", tag)
	case rec == nil || rec.Token != "tok-pend":
		t.Errorf("%s: Reserve of a pending key returned %+v", tag, rec)
	}
	ctx, cancel = context.WithTimeout(context.Background(), within)
	defer cancel()
	start = time.Now()
	fresh := idemstore.Key{Scope: "fk", Operation: "POST /charges", Key: "fresh-" + tag}
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: fresh, Fingerprint: "fp", Token: "t", Lease: time.Minute}); err != nil || !created {
		t.Errorf("%s: Reserve of a new key: created %t, %v (after %v)", tag, created, err, time.Since(start).Round(time.Millisecond))
	}
}

// fkStage is a step of Migrate at which a fault strikes: block holds what
// Migrate then waits for, on the schema's table, and returns what lets it
// go; mode is the lock Migrate waits for there.
type fkStage struct {
	name  string
	mode  string
	block func(t *testing.T, pool *pgxpool.Pool, schema, table string) (release func())
	// build: an operator's CREATE INDEX CONCURRENTLY is in progress,
	// and must end valid and be kept.
	build bool
}

var fkStages = []fkStage{
	{
		// Migration 005's CREATE INDEX waits for a writer's transaction
		// (a long CompleteTx, say).
		name: "build waits for a writer", mode: "AccessExclusiveLock",
		block: func(t *testing.T, pool *pgxpool.Pool, schema, table string) func() {
			end := fkTx(t, pool, fkWriterSQL(table))
			return func() { end(false) }
		},
	},
	{
		// The index of open records is built (in the migration's
		// transaction, uncommitted) and its DROP INDEX of the index of
		// states waits for a reader's transaction.
		name: "drop waits for a reader", mode: "AccessExclusiveLock",
		block: func(t *testing.T, pool *pgxpool.Pool, schema, table string) func() {
			end := fkTx(t, pool, "SELECT count(*) FROM "+table)
			return func() { end(false) }
		},
	},
	{
		// dropInvalidIndexes' LOCK TABLE waits for an operator's CREATE
		// INDEX CONCURRENTLY of the index of open records, which waits
		// for a writer.
		name: "lock waits for a concurrent build", mode: "AccessExclusiveLock", build: true,
		block: func(t *testing.T, pool *pgxpool.Pool, schema, table string) func() {
			end := fkTx(t, pool, fkWriterSQL(table))
			app := fkApp("build")
			wait := fkStartBuild(t, pool, app, table)
			fkBuildWaits(t, pool, schema, app)
			return func() {
				end(true)
				if err := wait(10 * time.Second); err != nil {
					t.Errorf("the operator's CREATE INDEX CONCURRENTLY: %v", err)
				}
			}
		},
	},
}

// fkBuildWaits polls until the build of app has made its (invalid) index
// and waits for a lock.
func fkBuildWaits(t *testing.T, pool *pgxpool.Pool, schema, app string) {
	t.Helper()
	if !fkPoll(t, 5*time.Second, func(ctx context.Context) (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity a, pg_index i
WHERE a.application_name = $1 AND a.wait_event_type = 'Lock' AND i.indexrelid = to_regclass($2) AND NOT i.indisvalid`,
			app, pgx.Identifier{schema, "idem_records_open_key"}.Sanitize()).Scan(&n)
		return n > 0, err
	}) {
		t.Fatalf("the operator's CREATE INDEX CONCURRENTLY did not come to wait with its invalid index within 5 s: %v", fkBusy(t, pool, app))
	}
}

// TestOpenKeyFaultMigrateInterrupted strikes a Migrate of a populated
// schema at version 4 while it waits at each step (see fkStages): its
// context is cancelled, or its backend terminated from another connection.
// Migrate must fail; the schema must be exactly at version 4 with the index
// of states intact; the store must go on serving (replay an answer, refuse
// a pending key, reserve a new one), each within a second, since the
// Migrate that held the table has returned; and once the test lets go of
// the table, a second Migrate must succeed (keeping an operator's index
// that was built meanwhile).
func TestOpenKeyFaultMigrateInterrupted(t *testing.T) {
	for _, st := range fkStages {
		for _, fault := range []string{"cancel", "terminate"} {
			t.Run(st.name+"/"+fault, func(t *testing.T) {
				pool := oaPool(t, 8)
				schema := oaSchemaAt(t, pool, 4)
				table := pgx.Identifier{schema, "idem_records"}.Sanitize()
				oaFill(t, pool, schema)
				s, err := New(pool, Config{Schema: schema, DisableBatch: true})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				keys := fkWrite(t, s)

				release := st.block(t, pool, schema, table)
				buildOid, _ := fkOpenKey(t, pool, schema)
				app := fkApp("migrate")
				mpool := fkAppPool(t, app, 1, nil)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				migrated := fkGo(func() error { return Migrate(ctx, mpool, Config{Schema: schema}) })
				pid := fkWaiter(t, pool, app, table, st.mode)
				switch fault {
				case "cancel":
					cancel()
				case "terminate":
					var ok bool
					if err := pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
						t.Fatalf("pg_terminate_backend(%d): %t, %v", pid, ok, err)
					}
				}
				err = fkResult(t, "Migrate", migrated, 5*time.Second)
				if err == nil {
					t.Fatalf("Migrate succeeded through a %s while it waited for %s", fault, st.mode)
				}
				t.Logf("Migrate: %v", err)
				fkCheckAt4(t, pool, schema)
				if oid, _ := fkOpenKey(t, pool, schema); oid != buildOid {
					t.Errorf("the failed Migrate changed idem_records_open_key (oid %d, now %d)", buildOid, oid)
				}
				// Migrate has returned: nothing of it may go on holding
				// the table, whatever the test still holds.
				if !fkGone(t, pool, app, time.Second) {
					t.Errorf("Migrate returned (%v), and a second later its backend still runs the migration: %q", err, fkBusy(t, pool, app))
				}
				fkServes(t, s, keys, time.Second, "after the "+fault)

				release()
				if !fkGone(t, pool, app, 5*time.Second) {
					t.Fatalf("the interrupted migration's backend still runs 5 s after the table was let go: %q", fkBusy(t, pool, app))
				}
				fkCheckAt4(t, pool, schema) // it never committed
				ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel2()
				if err := Migrate(ctx2, pool, Config{Schema: schema}); err != nil {
					t.Fatalf("a second Migrate: %v", err)
				}
				if v := oaVersions(t, pool, schema); !slices.Equal(v, []int32{1, 2, 3, 4, 5, 6}) {
					t.Errorf("versions %v after the second Migrate", v)
				}
				oaCheckOpenIndex(t, pool, schema)
				if st.build {
					if oid, _ := fkOpenKey(t, pool, schema); oid != buildOid {
						t.Errorf("the operator's index (oid %d), built valid, was replaced (oid %d)", buildOid, oid)
					}
				}
				fkServes(t, s, keys, 5*time.Second, "after the upgrade")
			})
		}
	}
}

// TestOpenKeyFaultConcurrentBuild runs Migrate on a populated schema at
// version 4 while an operator's CREATE INDEX CONCURRENTLY of the index of
// open records is in progress (waiting for a writer's transaction, as a
// build on a busy table does): Migrate finds its index invalid and must
// wait for the build rather than drop it, then keep the index the build
// made valid. A deadlock error that fails Migrate cleanly (schema at 4,
// a rerun succeeds) would be acceptable; hanging is not (every wait here
// is bounded).
func TestOpenKeyFaultConcurrentBuild(t *testing.T) {
	pool := oaPool(t, 8)
	schema := oaSchemaAt(t, pool, 4)
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	oaFill(t, pool, schema)
	end := fkTx(t, pool, fkWriterSQL(table))
	buildApp, migApp := fkApp("build"), fkApp("migrate")
	wait := fkStartBuild(t, pool, buildApp, table)
	fkBuildWaits(t, pool, schema, buildApp)
	oid, _ := fkOpenKey(t, pool, schema)

	mpool := fkAppPool(t, migApp, 1, map[string]string{"lock_timeout": "10s"})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	migrated := fkGo(func() error { return Migrate(ctx, mpool, Config{Schema: schema}) })
	fkWaiter(t, pool, migApp, table, "AccessExclusiveLock")
	// Migrate waits for the build, which waits for the writer: nothing of
	// the build is dropped meanwhile.
	if o, _ := fkOpenKey(t, pool, schema); o != oid {
		t.Fatalf("the build's index (oid %d) was dropped while the build ran (now %d)", oid, o)
	}
	end(true)
	buildErr := wait(10 * time.Second)
	migErr := fkResult(t, "Migrate", migrated, 10*time.Second)
	t.Logf("the operator's build: %v; Migrate: %v", buildErr, migErr)
	if migErr != nil {
		if !errors.Is(migErr, idemstore.ErrRetryable) {
			t.Errorf("Migrate during a build in progress: %v", migErr)
		}
		fkCheckAt4(t, pool, schema)
		if err := Migrate(context.Background(), pool, Config{Schema: schema}); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
	}
	oaCheckOpenIndex(t, pool, schema)
	if buildErr == nil {
		if o, _ := fkOpenKey(t, pool, schema); o != oid {
			t.Errorf("the index the operator built valid (oid %d) was replaced (oid %d)", oid, o)
		}
	}
}

// TestOpenKeyFaultBuildStartsAfterCheck: dropInvalidIndexes looks for
// invalid indexes once, and locks the table only if it found one. An
// operator's CREATE INDEX CONCURRENTLY that makes its invalid index just
// after that look (here: it queued for the table's SHARE UPDATE EXCLUSIVE
// lock behind a VACUUM, an ANALYZE or another concurrent build, which the
// test stands for by holding that lock, and Migrate queued behind it) is
// not seen; migration 005's CREATE INDEX IF NOT EXISTS then waits for the
// build and, when the build fails, takes its invalid index for the one it
// builds and drops the index of states. "fails" is the operator's cancel
// (or a statement timeout, or a lost connection); "deadlock" lets the
// build go on, and it meets the waiting migration. Either way the schema
// must end at 4 with the index of states, or at the latest with a valid index of
// open records, and a rerun of Migrate must leave a valid one.
func TestOpenKeyFaultBuildStartsAfterCheck(t *testing.T) {
	for _, variant := range []string{"fails", "deadlock"} {
		t.Run(variant, func(t *testing.T) {
			pool := oaPool(t, 8)
			schema := oaSchemaAt(t, pool, 4)
			table := pgx.Identifier{schema, "idem_records"}.Sanitize()
			oaFill(t, pool, schema)
			vacuum := fkTx(t, pool, "LOCK TABLE "+table+" IN SHARE UPDATE EXCLUSIVE MODE")
			writer := fkTx(t, pool, fkWriterSQL(table))
			buildApp, migApp := fkApp("build"), fkApp("migrate")
			wait := fkStartBuild(t, pool, buildApp, table)
			buildPid := fkWaiter(t, pool, buildApp, table, "ShareUpdateExclusiveLock")

			mpool := fkAppPool(t, migApp, 1, map[string]string{"lock_timeout": "10s"})
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			migrated := fkGo(func() error { return Migrate(ctx, mpool, Config{Schema: schema}) })
			fkWaiter(t, pool, migApp, table, "AccessExclusiveLock") // migration 005's LOCK TABLE
			vacuum(true)
			fkBuildWaits(t, pool, schema, buildApp) // its invalid index made, it waits for the writer
			if variant == "fails" {
				var ok bool
				if err := pool.QueryRow(context.Background(), "SELECT pg_cancel_backend($1)", buildPid).Scan(&ok); err != nil || !ok {
					t.Fatalf("pg_cancel_backend: %t, %v", ok, err)
				}
				t.Logf("the operator's build, cancelled: %v", wait(5*time.Second))
				writer(false)
			} else {
				writer(true)
				t.Logf("the operator's build: %v", wait(10*time.Second))
			}
			migErr := fkResult(t, "Migrate", migrated, 10*time.Second)
			t.Logf("Migrate: %v; indexes: %v", migErr, oaIndexes(t, pool, schema))
			fkCheckConsistent(t, pool, schema)
			if err := Migrate(context.Background(), pool, Config{Schema: schema}); err != nil {
				t.Fatalf("Migrate again: %v", err)
			}
			oaCheckOpenIndex(t, pool, schema)
		})
	}
}

// TestOpenKeyFaultStoreAcrossUpgrade writes keys in every state on a
// populated schema at version 4 through stores made before the upgrade
// (one batching, as Config's default is, one not), whose statements are
// prepared and planned by then, and runs Migrate while the batching store
// serves traffic: concurrent Reserves of one new key (exactly one may
// acquire it), a second Reserve of a key just reserved (must conflict),
// Complete, and the replay of answers. After the upgrade, through those
// stores and one made after it: expired pending keys are listed by
// ListExpiredLeases and recovered (Takeover, Release with IfExpired) once
// only; answers replay; needs_review keys are listed and counted; a
// Reserve of any existing key conflicts.
func TestOpenKeyFaultStoreAcrossUpgrade(t *testing.T) {
	pool := oaPool(t, 12)
	ctx := context.Background()
	schema := oaSchemaAt(t, pool, 4)
	oaFill(t, pool, schema)
	batching, err := New(pool, Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer batching.Close()
	alone, err := New(pool, Config{Schema: schema, DisableBatch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()

	const op = "POST /fk-upgrade"
	key := func(name string, i int) idemstore.Key {
		return idemstore.Key{Scope: "fk", Operation: op, Key: fmt.Sprintf("%s-%d", name, i)}
	}
	answer := func(k idemstore.Key) *idemstore.Response {
		return &idemstore.Response{Status: 201, Body: []byte("answer of " + k.Key)}
	}
	reserve := func(s *Store, k idemstore.Key, token string, lease time.Duration) (*idemstore.Record, bool) {
		t.Helper()
		rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: token, Lease: lease})
		if err != nil {
			t.Fatalf("Reserve %v: %v", k, err)
		}
		return rec, created
	}
	const nExpired, nReview, nDone = 4, 3, 3
	for i := range nExpired {
		if _, created := reserve([]*Store{batching, alone}[i%2], key("expired", i), fmt.Sprintf("old-%d", i), time.Millisecond); !created {
			t.Fatalf("set-up: expired-%d not created", i)
		}
	}
	for i := range nReview {
		k := key("review", i)
		reserve(alone, k, "tok", time.Minute)
		if err := batching.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok", Reason: "upstream timeout"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range nDone {
		k := key("done", i)
		reserve(batching, k, "tok", time.Minute)
		if err := alone.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: answer(k), Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	// Prepare and plan (past five runs, generically) the reads on the
	// pool's connections before the upgrade.
	for range 8 {
		for _, s := range []*Store{batching, alone} {
			if _, err := s.ListExpiredLeases(ctx, 1000); err != nil {
				t.Fatal(err)
			}
			if _, err := s.List(ctx, idemstore.ListParams{State: idemstore.StateNeedsReview, Operation: op, Limit: 50}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Counts(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Get(ctx, key("done", 0)); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Traffic through the batching store while Migrate runs.
	tr := oaRunTraffic(func(i int) error {
		k := key("traffic", i)
		var (
			cwg     sync.WaitGroup
			mu      sync.Mutex
			errs    []error
			winners []string
		)
		for c := range 3 {
			cwg.Go(func() {
				token := fmt.Sprintf("t%d", c)
				_, created, err := batching.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: token, Lease: time.Minute})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("Reserve %v: %w", k, err))
				} else if created {
					winners = append(winners, token)
				}
			})
		}
		cwg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if len(winners) != 1 {
			return fmt.Errorf("%d concurrent Reserves of %v: acquired by %q, want exactly one", 3, k, winners)
		}
		if rec, created, err := batching.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "late", Lease: time.Minute}); err != nil || created || rec == nil || rec.Token != winners[0] {
			return fmt.Errorf("a late Reserve of %v held by %s: created %t, %+v, %v", k, winners[0], created, rec, err)
		}
		if err := batching.Complete(ctx, idemstore.CompleteParams{Key: k, Token: winners[0], Response: answer(k), Retention: time.Hour}); err != nil {
			return fmt.Errorf("Complete %v: %w", k, err)
		}
		d := key("done", i%nDone)
		if rec, created, err := batching.Reserve(ctx, idemstore.ReserveParams{Key: d, Fingerprint: "fp", Token: "again", Lease: time.Minute}); err != nil || created ||
			rec == nil || rec.Response == nil || string(rec.Response.Body) != string(answer(d).Body) {
			return fmt.Errorf("a Reserve of the completed %v: created %t, %+v, %v", d, created, rec, err)
		}
		return nil
	})
	tr.wait(3)
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Migrate failed with a deadlock against a batch of Reserves before
	// migration 005 took its lock first (TestOpenKeyFaultMigrateDeadlocks
	// holds that it no longer does). A deadlock is a clean failure, rolled
	// back; here the store's safety is what is checked, so Migrate is run
	// again after one.
	var migErr error
	deadlocks := 0
	for range 5 {
		if migErr = Migrate(mctx, pool, Config{Schema: schema}); !errors.Is(migErr, idemstore.ErrRetryable) {
			break
		}
		deadlocks++
		fkCheckAt4(t, pool, schema)
		tr.wait(1)
	}
	tr.wait(3)
	rounds, trafErr := tr.end()
	t.Logf("Migrate failed %d times with a deadlock (then %v)", deadlocks, migErr)
	if migErr != nil {
		t.Fatalf("Migrate during traffic: %v", migErr)
	}
	if trafErr != nil {
		t.Errorf("traffic across the upgrade (%d rounds): %v", rounds, trafErr)
	}
	oaCheckOpenIndex(t, pool, schema)
	after, err := New(pool, Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()

	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	stores := map[string]*Store{"batching store made before": batching, "store made before, batching off": alone, "store made after": after}
	for name, s := range stores {
		// Expired pending keys, as recovery finds them (their 1 ms
		// leases have run out by the server's clock by now, or soon).
		var expired []string
		if !fkPoll(t, 2*time.Second, func(ctx context.Context) (bool, error) {
			recs, err := s.ListExpiredLeases(ctx, 1000)
			expired = expired[:0]
			for _, r := range recs {
				if r.Key.Operation == op {
					expired = append(expired, r.Key.Key)
				}
			}
			slices.Sort(expired)
			return len(expired) == nExpired, err
		}) {
			t.Errorf("%s: ListExpiredLeases after the upgrade lists %q, want the %d expired keys", name, expired, nExpired)
		}
		for i := range nDone {
			k := key("done", i)
			if rec, err := s.Get(ctx, k); err != nil || rec.State != idemstore.StateCompleted || rec.Response == nil || string(rec.Response.Body) != string(answer(k).Body) {
				t.Errorf("%s: Get %v after the upgrade: %+v, %v: the answer does not replay", name, k, rec, err)
			}
		}
		review := oaListAll(t, s, idemstore.ListParams{State: idemstore.StateNeedsReview, Operation: op, Limit: 2})
		if len(review) != nReview {
			t.Errorf("%s: List of needs_review after the upgrade: %q, want %d keys", name, review, nReview)
		}
		c, err := s.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var want idemstore.Counts
		if err := pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'needs_review') FROM "+table).Scan(&want.Pending, &want.NeedsReview); err != nil {
			t.Fatal(err)
		}
		var opCounts idemstore.OperationCounts
		for _, oc := range c.Operations {
			if oc.Operation == op {
				opCounts = oc
			}
		}
		if c.Pending != want.Pending || c.NeedsReview != want.NeedsReview || opCounts.Pending != nExpired || opCounts.NeedsReview != nReview {
			t.Errorf("%s: Counts after the upgrade: %d pending, %d needs_review (%+v for %s); the table has %d and %d (%d and %d)",
				name, c.Pending, c.NeedsReview, opCounts, op, want.Pending, want.NeedsReview, nExpired, nReview)
		}
		for _, k := range []idemstore.Key{key("expired", 0), key("review", 0), key("done", 0), key("traffic", 0)} {
			if rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "intruder", Lease: time.Minute}); err != nil || created || rec == nil || rec.Token == "intruder" {
				t.Errorf("%s: Reserve of the existing %v after the upgrade: created %t, %+v, %v", name, k, created, rec, err)
			}
		}
	}

	// Recovery of each expired key, once, through each kind of store.
	recover := []struct {
		s    *Store
		k    idemstore.Key
		take bool
	}{{batching, key("expired", 0), true}, {alone, key("expired", 1), false}, {after, key("expired", 2), true}, {after, key("expired", 3), false}}
	for i, r := range recover {
		old := fmt.Sprintf("old-%d", i)
		var err error
		if r.take {
			err = r.s.Takeover(ctx, idemstore.TakeoverParams{Key: r.k, OldToken: old, NewToken: "new", Lease: time.Minute})
		} else {
			err = r.s.Release(ctx, idemstore.ReleaseParams{Key: r.k, Token: old, IfExpired: true})
		}
		if err != nil {
			t.Errorf("recovery (takeover %t) of %v after the upgrade: %v: the key stays stuck", r.take, r.k, err)
			continue
		}
		// A second recovery with the same token finds the key gone or
		// held by another: it must never succeed.
		for _, s := range []*Store{batching, alone, after} {
			if err := s.Takeover(ctx, idemstore.TakeoverParams{Key: r.k, OldToken: old, NewToken: "twice", Lease: time.Minute}); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Errorf("a second Takeover of %v with the old token: %v, want ErrLeaseLost", r.k, err)
			}
		}
		rec, created := reserve(alone, r.k, "next", time.Minute)
		switch {
		case r.take && (created || rec == nil || rec.Token != "new"):
			t.Errorf("Reserve of %v after its takeover: created %t, %+v", r.k, created, rec)
		case !r.take && !created:
			t.Errorf("Reserve of %v after its release: not created, %+v", r.k, rec)
		}
	}
	t.Logf("%d rounds of traffic (3 concurrent Reserves of a new key each) across the upgrade", rounds)
}

// TestOpenKeyFaultMigrateDeadlocks: migration 005 builds the index of
// open records under a SHARE lock on idem_records and then, in the same
// transaction, drops the index of states, which takes ACCESS EXCLUSIVE: a
// lock upgrade. A store transaction that holds a weaker lock on the table
// and then needs ROW EXCLUSIVE, while Migrate holds or waits for SHARE,
// waits for Migrate, which then waits for it: a deadlock, and PostgreSQL
// aborts one of them (here, at once, Migrate). Two such store paths:
//
//   - "batched Reserves": the batching store's reserveMany (Config's
//     default), run from its prepared statement, locks the table ACCESS
//     SHARE, for its read of conflicting records, before ROW EXCLUSIVE,
//     for its insert; on a busy store a batch is nearly always in flight;
//   - "Takeover": recovery of an expired lease locks the record's row FOR
//     UPDATE (ROW SHARE) and then updates it (ROW EXCLUSIVE).
//
// The test makes that order happen: Migrate queued behind a writer, the
// store's call waiting behind Migrate, then the writer ends. The store's
// call and Migrate must both succeed. (Migration 005 now takes the table's
// ACCESS EXCLUSIVE lock first, so the store's call waits for its first
// lock instead of holding it.)
func TestOpenKeyFaultMigrateDeadlocks(t *testing.T) {
	for _, path := range []string{"batched Reserves", "Takeover"} {
		t.Run(path, func(t *testing.T) {
			pool := oaPool(t, 8)
			ctx := context.Background()
			schema := oaSchemaAt(t, pool, 4)
			table := pgx.Identifier{schema, "idem_records"}.Sanitize()
			oaFill(t, pool, schema)
			storeApp, migApp := fkApp("store"), fkApp("migrate")
			// One connection: the batch runs on the one its statement
			// was prepared on.
			s, err := New(fkAppPool(t, storeApp, 1, nil), Config{Schema: schema, DisableBatch: path == "Takeover"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			key := func(name string) idemstore.Key {
				return idemstore.Key{Scope: "fk", Operation: "POST /charges", Key: name}
			}
			batch := func(ctx context.Context, names ...string) []<-chan error {
				p := s.Batcher().Pause()
				var chs []<-chan error
				for _, name := range names {
					chs = append(chs, fkGo(func() error {
						_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key(name), Fingerprint: "fp", Token: "t", Lease: time.Minute})
						if err == nil && !created {
							err = fmt.Errorf("Reserve of the new key %v: not created", key(name))
						}
						return err
					}))
				}
				p.Wait(len(names))
				p.Resume()
				return chs
			}
			var start func(ctx context.Context) []<-chan error
			switch path {
			case "batched Reserves":
				for _, ch := range batch(ctx, "warm-1", "warm-2") { // prepares reserveMany
					if err := fkResult(t, "Reserve", ch, 5*time.Second); err != nil {
						t.Fatal(err)
					}
				}
				if st, _ := s.BatchStats(); st.Batches == 0 {
					t.Fatalf("set-up: no batch ran: %+v", st)
				}
				start = func(ctx context.Context) []<-chan error { return batch(ctx, "a", "b") }
			case "Takeover":
				if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key("lost"), Fingerprint: "fp", Token: "old", Lease: time.Millisecond}); err != nil {
					t.Fatal(err)
				}
				if !fkPoll(t, 2*time.Second, func(ctx context.Context) (bool, error) {
					recs, err := s.ListExpiredLeases(ctx, 1000)
					return slices.ContainsFunc(recs, func(r *idemstore.Record) bool { return r.Key == key("lost") }), err
				}) {
					t.Fatal("set-up: the 1 ms lease did not expire within 2 s")
				}
				start = func(ctx context.Context) []<-chan error {
					return []<-chan error{fkGo(func() error {
						return s.Takeover(ctx, idemstore.TakeoverParams{Key: key("lost"), OldToken: "old", NewToken: "new", Lease: time.Minute})
					})}
				}
			}

			writer := fkTx(t, pool, fkWriterSQL(table))
			mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			mpool := fkAppPool(t, migApp, 1, nil)
			migrated := fkGo(func() error { return Migrate(mctx, mpool, Config{Schema: schema}) })
			fkWaiter(t, pool, migApp, table, "AccessExclusiveLock")
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			defer scancel()
			calls := start(sctx)
			// Its first lock (ACCESS SHARE, ROW SHARE) or, before migration
			// 005 took the table's exclusive lock first, ROW EXCLUSIVE
			// while holding that first lock.
			fkWaiter(t, pool, storeApp, table, "")
			rows, _ := pool.Query(ctx, `SELECT l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE a.application_name = $1 AND l.relation = to_regclass($2) AND l.granted`, storeApp, table)
			held, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("the store's call holds %v on idem_records and waits behind Migrate", held)
			writer(false)

			migErr := fkResult(t, "Migrate", migrated, 10*time.Second)
			for _, ch := range calls {
				if err := fkResult(t, path, ch, 10*time.Second); err != nil {
					t.Errorf("%s during the upgrade: %v", path, err)
				}
			}
			if migErr != nil {
				var pgErr *pgconn.PgError
				if errors.As(migErr, &pgErr) && pgErr.Detail != "" {
					t.Logf("%s", pgErr.Detail)
				}
				t.Errorf("Migrate while the store's call (%s) waits: %v", path, migErr)
				fkCheckAt4(t, pool, schema)
				return
			}
			oaCheckOpenIndex(t, pool, schema)
		})
	}
}
