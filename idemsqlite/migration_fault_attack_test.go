package idemsqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// Faults during migration 0003 (partial indexes): a process killed while it
// migrates, writers on the old schema while another handle migrates, and a
// context cancelled mid-migration. After each, the file must be at schema 2
// with the old indexes or at schema 3 with the new ones, pass
// integrity_check (which also checks that each partial index holds exactly
// the rows its WHERE clause selects), hold every record unchanged, and
// migrate and work on the next try.

// mfChildEnv names the database file a re-executed test binary migrates
// as a child process (see init below). TestMain in multiprocess_test.go
// knows nothing of it: init runs before TestMain and takes the process
// over when the variable is set.
const mfChildEnv = "IDEMSQLITE_MIGFAULT_CHILD_DB"

func init() {
	path := os.Getenv(mfChildEnv)
	if path == "" {
		return
	}
	if err := mfChild(path); err != nil {
		fmt.Fprintf(os.Stderr, "migfault child: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// mfChild opens path, says "migrating", runs New (which applies migration
// 0003), says "migrated", and waits for stdin to close: the parent kills it
// somewhere along the way.
func mfChild(path string) error {
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{BusyTimeout: time.Minute})
	if err != nil {
		return err
	}
	defer db.Close()
	fmt.Println("migrating")
	if _, err := idemsqlite.New(db, idemsqlite.Config{}); err != nil {
		return err
	}
	fmt.Println("migrated")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// mfT0 is the bulk records' reference time, on a whole millisecond.
var mfT0 = piaT0

// mfGen is a WITH clause defining gen, a table of the n bulk records' columns (in recordColumns order)
// computed from their index alone, so that the file's records can be
// compared with it in SQL. ?1 is the encoded response of the completed
// ones, ?2 the encoded request of all. Keys are a permutation of the
// indexes, so the insertion order is unrelated to the key order. Leases
// and expiries straddle mfT0 when spread is true, and lie a day past it
// otherwise.
func mfGen(n int, spread bool) string {
	lease := fmt.Sprintf("%d + ((i * 37) %% 100000 - 50000) * 1000", mfT0.UnixMilli())
	expires := fmt.Sprintf("%d + ((i * 13) %% 1000 - 500) * 1000", mfT0.UnixMilli())
	if !spread {
		lease = fmt.Sprintf("%d + 86400000 + i", mfT0.UnixMilli())
		expires = fmt.Sprintf("%d + 86400000 + i", mfT0.UnixMilli())
	}
	return fmt.Sprintf(`WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < %[1]d),
		gen AS (SELECT 'bulk' AS scope, 'POST /op' || ((i / 3) %% 3) AS operation, printf('k-%%07d', (i * 7919) %% %[1]d) AS "key",
			'fp' AS fingerprint,
			CASE i %% 3 WHEN 0 THEN 'pending' WHEN 1 THEN 'completed' ELSE 'needs_review' END AS state,
			'tok-' || i AS token,
			%[2]s AS lease_until,
			CASE i %% 3 WHEN 1 THEN ?1 END AS response,
			CASE i %% 3 WHEN 2 THEN 'why ' || i ELSE '' END AS reason,
			%[4]d AS created_at,
			CASE i %% 3 WHEN 1 THEN %[3]s END AS expires_at,
			%[4]d AS updated_at,
			?2 AS request
		FROM g) `, n, lease, expires, mfT0.Add(-2*time.Hour).UnixMilli())
}

var (
	mfResp = idemstore.EncodeResponse(&idemstore.Response{Status: 201, Body: []byte("done")})
	mfReq  = idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/bulk"})
)

// mfSeed brings db to schema 2 and writes n bulk records in one
// transaction.
func mfSeed(t *testing.T, db *sql.DB, n int, spread bool) {
	t.Helper()
	piaBuildV2(t, db)
	if _, err := db.Exec(mfGen(n, spread)+`INSERT INTO idem_records
		(scope, operation, "key", fingerprint, state, token, lease_until, response, reason, created_at, expires_at, updated_at, request)
		SELECT * FROM gen`, mfResp, mfReq); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
}

// mfBuildTo applies by hand the embedded migrations after those db
// records, up to version, as an idem that knew no later one left it.
func mfBuildTo(t *testing.T, db *sql.DB, version int) {
	t.Helper()
	versions, _ := piaSchema(t, db)
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".sql")
		v, err := strconv.Atoi(name[:4])
		if err != nil {
			t.Fatal(err)
		}
		if v > version || slices.Contains(versions, v) {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(b)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := db.Exec(`INSERT INTO idem_schema_migrations VALUES (?, ?, 0)`, v, name); err != nil {
			t.Fatal(err)
		}
	}
}

// mfBulkIntact checks that the bulk records in db are exactly the n that
// mfGen describes, column for column.
func mfBulkIntact(t *testing.T, db *sql.DB, n int, spread bool) {
	t.Helper()
	cols := `scope, operation, "key", fingerprint, state, token, lease_until, response, reason, created_at, expires_at, updated_at, request`
	// As many bulk keys as written (the primary key makes them distinct),
	// and every written row is there column for column: the same set.
	var count, missing int
	err := db.QueryRow(mfGen(n, spread)+`SELECT
		(SELECT count(*) FROM idem_records WHERE scope = 'bulk'),
		(SELECT count(*) FROM (SELECT * FROM gen EXCEPT SELECT `+cols+` FROM idem_records))`,
		mfResp, mfReq).Scan(&count, &missing)
	if err != nil {
		t.Fatal(err)
	}
	if count != n || missing != 0 {
		t.Fatalf("bulk records: %d, want %d; %d written rows missing or changed", count, n, missing)
	}
}

// mfSchemaEither checks that db is at schema 2 with the old indexes or at
// schema 3 with the new ones, and returns the version.
func mfSchemaEither(t *testing.T, db *sql.DB) int {
	t.Helper()
	versions, indexes := piaSchema(t, db)
	switch {
	case slices.Equal(versions, []int{1, 2}) && slices.Equal(indexes, piaV2Indexes):
		return 2
	case slices.Equal(versions, piaLatest) && slices.Equal(indexes, piaLatestIndexes):
		return 3
	}
	t.Fatalf("half-migrated schema: versions %v indexes %q", versions, indexes)
	return 0
}

// mfIndexesAgree checks that the statements served by the partial indexes
// return what a scan of the table does: ListExpiredLeases and List by
// state against NOT INDEXED counts, on the store's fake clock at now.
func mfIndexesAgree(t *testing.T, s *idemsqlite.Store, db *sql.DB, now time.Time) {
	t.Helper()
	ctx := context.Background()
	count := func(where string) int {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM idem_records NOT INDEXED WHERE `+where, now.UnixMilli()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	wantExpired := count(`state = 'pending' AND lease_until <= ?1`)
	recs, err := s.ListExpiredLeases(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != min(wantExpired, 1000) {
		t.Fatalf("ListExpiredLeases(1000): %d records, want %d", len(recs), min(wantExpired, 1000))
	}
	for i, r := range recs {
		if r.State != idemstore.StatePending || r.LeaseUntil.After(now) || (i > 0 && r.LeaseUntil.Before(recs[i-1].LeaseUntil)) {
			t.Fatalf("ListExpiredLeases: record %d %q state %s lease %v, out of place", i, r.Key, r.State, r.LeaseUntil)
		}
	}
	// One page of List per open state and operation, checked against a scan.
	for _, st := range []idemstore.State{idemstore.StatePending, idemstore.StateNeedsReview} {
		for _, op := range []string{"POST /op1", "POST /writer"} {
			var want []idemstore.Key
			rows, err := db.Query(`SELECT scope, operation, "key" FROM idem_records NOT INDEXED
				WHERE state = ? AND operation = ? ORDER BY scope, operation, "key" LIMIT 300`, string(st), op)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var k idemstore.Key
				if err := rows.Scan(&k.Scope, &k.Operation, &k.Key); err != nil {
					t.Fatal(err)
				}
				want = append(want, k)
			}
			if err := errors.Join(rows.Err(), rows.Close()); err != nil {
				t.Fatal(err)
			}
			lp, err := s.List(ctx, idemstore.ListParams{State: st, Operation: op, Limit: 300})
			if err != nil {
				t.Fatal(err)
			}
			if got := piaKeys(lp.Records); !slices.Equal(got, want) {
				t.Fatalf("List state %s operation %q: %d keys, want %d (first got %v, want %v)", st, op, len(got), len(want), got[:min(3, len(got))], want[:min(3, len(want))])
			}
		}
	}
}

// mfLockHeld reports whether another connection holds the write lock: a
// BEGIN IMMEDIATE with a 1ms busy timeout fails with SQLITE_BUSY.
func mfLockHeld(t *testing.T, probe *sql.DB) bool {
	t.Helper()
	_, err := probe.Exec("BEGIN IMMEDIATE")
	if err == nil {
		if _, err := probe.Exec("ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		return false
	}
	if !strings.Contains(err.Error(), "locked") && !strings.Contains(err.Error(), "busy") {
		t.Fatalf("probe: %v", err)
	}
	return true
}

func mfOpen(t *testing.T, path string, opts idemsqlite.OpenOptions) *sql.DB {
	t.Helper()
	db, err := idemsqlite.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mfCopy(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

const mfKillRows = 20_000

// TestMigrationFaultKilled: a child process running New on a schema-2 file
// of 20k records is SIGKILLed at several points of migration 0003 (once
// it holds the write lock, once it has held it through 30 polls of the
// parent, and after it said it committed). Reopened,
// the file is at version 2 with the old indexes or 3 with the new ones,
// passes integrity_check, holds every record as written, and New migrates
// it and the store works on it.
func TestMigrationFaultKilled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	seed := filepath.Join(dir, "seed.db")
	func() {
		db, err := idemsqlite.Open(seed, idemsqlite.OpenOptions{MaxOpenConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		mfSeed(t, db, mfKillRows, true)
	}()

	type killPoint struct {
		name string
		// ready reports, polled, that the child is to be killed now. done
		// is true once the child said "migrated".
		ready func(probe *sql.DB, walStart int64, walPath string, done bool) bool
	}
	walSize := func(p string) int64 {
		fi, err := os.Stat(p)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	heldPolls := func(n int) func(*sql.DB, int64, string, bool) bool {
		held := 0
		return func(probe *sql.DB, _ int64, _ string, done bool) bool {
			if done {
				return true
			}
			if mfLockHeld(t, probe) {
				held++
			}
			return held >= n
		}
	}
	points := []killPoint{
		{"holds the lock", func(probe *sql.DB, _ int64, _ string, done bool) bool { return done || mfLockHeld(t, probe) }},
		// The lock held through that many polls: somewhere in the middle
		// of the statements of migration 0003, or past them.
		{"held through 30 polls", heldPolls(30)},
		{"committed", func(_ *sql.DB, _ int64, _ string, done bool) bool { return done }},
	}
	for i, kp := range points {
		t.Run(kp.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprintf("kill-%d.db", i))
			mfCopy(t, seed, path)
			// The probe opens the file (WAL mode) before the child does.
			probe := mfOpen(t, path, idemsqlite.OpenOptions{BusyTimeout: time.Millisecond, MaxOpenConns: 1})
			walStart := walSize(path + "-wal")

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), mfChildEnv+"="+path)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			lines := make(chan string, 2)
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			if l, ok := <-lines; !ok || l != "migrating" {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("child: %q, %v; stderr %s", l, ok, stderr.String())
			}
			done, polls := false, 0
			for !kp.ready(probe, walStart, path+"-wal", done) {
				select {
				case l, ok := <-lines:
					if !ok || l != "migrated" {
						_ = cmd.Process.Kill()
						_ = cmd.Wait()
						t.Fatalf("child: %q, %v; stderr %s", l, ok, stderr.String())
					}
					done = true
				default:
					polls++ // each probe waits out its busy timeout while the lock is held
				}
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child ended with %v, not killed; stderr %s", err, stderr.String())
			}
			probe.Close()

			db := mfOpen(t, path, idemsqlite.OpenOptions{})
			v := mfSchemaEither(t, db)
			t.Logf("killed after %d polls (migrated said: %v): found at version %d", polls, done, v)
			if kp.name == "committed" && v != 3 {
				t.Fatalf("the child said migrated, yet the file is at version %d", v)
			}
			piaIntegrity(t, db)
			mfBulkIntact(t, db, mfKillRows, true)

			clock := testenv.NewClock(mfT0)
			s, err := idemsqlite.New(db, idemsqlite.Config{Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			piaCheckSchema(t, db, piaLatest, piaLatestIndexes)
			piaIntegrity(t, db)
			mfIndexesAgree(t, s, db, clock.Now())
			mfStoreWorks(t, s, clock)
			var wantPurged int
			if err := db.QueryRow(`SELECT count(*) FROM idem_records NOT INDEXED WHERE state = 'completed' AND expires_at <= ?`, clock.Now().UnixMilli()).Scan(&wantPurged); err != nil {
				t.Fatal(err)
			}
			if n, err := s.Purge(context.Background(), idemstore.PurgeParams{BatchSize: 5000}); err != nil || n != wantPurged || wantPurged == 0 {
				t.Fatalf("Purge = %d, %v; want %d (> 0)", n, err, wantPurged)
			}
			piaIntegrity(t, db)
		})
	}
}

// mfStoreWorks moves one new record through reserve, escalate, resolve
// away (release is not open to needs_review: complete another) and checks
// it is found by the partial indexes.
func mfStoreWorks(t *testing.T, s *idemsqlite.Store, clock *testenv.Clock) {
	t.Helper()
	ctx := context.Background()
	k := idemstore.Key{Scope: "after", Operation: "POST /writer", Key: "fresh"}
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "t1", Lease: time.Millisecond}); err != nil || !created {
		t.Fatalf("Reserve after the fault: created %v, %v", created, err)
	}
	clock.Advance(time.Millisecond)
	lp, err := s.List(ctx, idemstore.ListParams{State: idemstore.StatePending, Operation: k.Operation})
	if err != nil || !slices.ContainsFunc(lp.Records, func(r *idemstore.Record) bool { return r.Key == k }) {
		t.Fatalf("List of pending records misses the one just reserved (%d records, %v)", len(lp.Records), err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t1", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, k); err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("Get after Complete: %+v, %v", rec, err)
	}
}

// TestMigrationFaultWritersOnOldSchema: two handles on the file at the
// schema before the last migration (an index migration, as 0003 was when
// this was written; the code reads and writes the columns of every
// earlier one), each a store with SkipMigrate (one batching, one not), keep reserving,
// completing, escalating and releasing keys, with a second Reserve under
// another token after each, before, during and after a third handle's
// Migrate. Every call must succeed and do what it says once: afterwards
// Get of every key, List by each state, ListExpiredLeases and Purge agree
// with the model, through the stores opened on the old schema (their
// statements prepared before the migration) and through a fresh one, and
// the partial indexes hold the rows written around their creation.
func TestMigrationFaultWritersOnOldSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	const bulk = 10_000
	migDB := mfOpen(t, path, idemsqlite.OpenOptions{BusyTimeout: 5 * time.Minute})
	mfSeed(t, migDB, bulk, false)
	mfBuildTo(t, migDB, piaLatest[len(piaLatest)-2])
	clock := testenv.NewClock(mfT0)

	var writers []*idemsqlite.Store
	for _, cfg := range []idemsqlite.Config{{}, {DisableBatch: true}} {
		cfg.SkipMigrate, cfg.Now = true, clock.Now
		s, err := idemsqlite.New(mfOpen(t, path, idemsqlite.OpenOptions{BusyTimeout: 5 * time.Minute}), cfg)
		if err != nil {
			t.Fatal(err)
		}
		writers = append(writers, s)
	}

	const (
		op        = "POST /writer"
		warmup    = 40   // calls started before Migrate starts
		afterward = 40   // calls started after Migrate returned
		maxKeys   = 2000 // a bound, should Migrate never return
	)
	var (
		mu        sync.Mutex
		m         = piaModel{}
		released  []idemstore.Key
		errs      []error
		phase     atomic.Int32 // 0 before Migrate, 1 during, 2 after
		byPhase   [3]atomic.Int64
		next      atomic.Int64
		startMig  = make(chan struct{})
		startOnce sync.Once
		migErr    error
		wg        sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	now := mfT0.UnixMilli()
	work := func(s *idemsqlite.Store) {
		defer wg.Done()
		for {
			ph := phase.Load()
			if ph == 2 && byPhase[2].Load() >= afterward {
				return
			}
			i := int(next.Add(1))
			if i > maxKeys {
				return
			}
			if byPhase[0].Load()+byPhase[1].Load()+byPhase[2].Load() >= warmup {
				startOnce.Do(func() { close(startMig) })
			}
			byPhase[ph].Add(1)
			k := idemstore.Key{Scope: "writer", Operation: op, Key: fmt.Sprintf("w-%05d", i)}
			tok := fmt.Sprintf("tok-%d", i)
			if rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute}); err != nil || !created {
				fail(fmt.Errorf("phase %d: Reserve %s: created %v (%+v), %v", ph, k.Key, created, rec, err))
				continue
			}
			want := &piaRec{state: idemstore.StatePending, token: tok, leaseUntil: now + 60_000}
			var err error
			switch i % 4 {
			case 1:
				err = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: &idemstore.Response{Status: 201, Body: []byte(tok)}, Retention: time.Minute})
				want.state, want.expiresAt = idemstore.StateCompleted, now+60_000
			case 2:
				err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: "unsure"})
				want.state = idemstore.StateNeedsReview
			case 3:
				err = s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tok})
				want = nil
			}
			if err != nil {
				fail(fmt.Errorf("phase %d: key %s: %w", ph, k.Key, err))
				continue
			}
			// A second attempt under another token finds the first one's
			// record (or, released, takes the key: release it again).
			rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok + "-again", Lease: time.Minute})
			switch {
			case err != nil:
				fail(fmt.Errorf("phase %d: second Reserve %s: %w", ph, k.Key, err))
				continue
			case want == nil && !created:
				fail(fmt.Errorf("phase %d: second Reserve %s after release: created false (%+v)", ph, k.Key, rec))
				continue
			case want == nil:
				if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: tok + "-again"}); err != nil {
					fail(fmt.Errorf("phase %d: second Release %s: %w", ph, k.Key, err))
					continue
				}
			case created || rec.Token != tok || rec.State != want.state:
				fail(fmt.Errorf("phase %d: second Reserve %s: created %v, token %q state %s; want the first one's record (%s)", ph, k.Key, created, rec.Token, rec.State, want.state))
				continue
			}
			mu.Lock()
			if want == nil {
				released = append(released, k)
			} else {
				m[k] = want
			}
			mu.Unlock()
		}
	}
	for _, s := range writers {
		for range 2 {
			wg.Add(1)
			go work(s)
		}
	}
	migDone := make(chan struct{})
	go func() {
		defer close(migDone)
		<-startMig
		phase.Store(1)
		migErr = idemsqlite.Migrate(ctx, migDB)
		phase.Store(2)
	}()
	wg.Wait()
	startOnce.Do(func() { close(startMig) }) // should every writer have failed
	<-migDone
	t.Logf("calls started before Migrate %d, during %d, after %d", byPhase[0].Load(), byPhase[1].Load(), byPhase[2].Load())
	if migErr != nil {
		t.Fatalf("Migrate: %v", migErr)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if phase.Load() != 2 || byPhase[2].Load() < afterward {
		t.Fatalf("the writers stopped before running after the migration (keys %d)", next.Load())
	}

	piaCheckSchema(t, migDB, piaLatest, piaLatestIndexes)
	piaIntegrity(t, migDB)
	mfBulkIntact(t, migDB, bulk, false)
	fresh, err := idemsqlite.New(migDB, idemsqlite.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	stores := append(slices.Clip(writers), fresh)

	check := func(step string) {
		t.Helper()
		for si, s := range stores {
			for k, want := range m {
				rec, err := s.Get(ctx, k)
				if err != nil {
					t.Fatalf("%s: store %d: Get %s: %v", step, si, k.Key, err)
				}
				if d := piaSame(rec, want); d != "" {
					t.Fatalf("%s: store %d: Get %s: %s", step, si, k.Key, d)
				}
			}
			for _, k := range released {
				if rec, err := s.Get(ctx, k); !errors.Is(err, idemstore.ErrNotFound) {
					t.Fatalf("%s: store %d: released %s: %+v, %v", step, si, k.Key, rec, err)
				}
			}
			for _, st := range piaStates[1:] {
				got := piaKeys(piaListAll(t, s, idemstore.ListParams{State: st, Operation: op, Limit: 200}, len(m)))
				if want := m.expected(st, op, nil); !slices.Equal(got, want) {
					t.Fatalf("%s: store %d: List %s: %d keys, want %d", step, si, st, len(got), len(want))
				}
			}
		}
	}
	check("after the migration")
	mfIndexesAgree(t, fresh, migDB, clock.Now())

	// Two minutes on, every pending writer key's lease has ended (the
	// bulk ones end a day on) and every completed one expired.
	clock.Advance(2 * time.Minute)
	var wantExpired []idemstore.Key
	wantPurged := 0
	for k, r := range m {
		switch r.state {
		case idemstore.StatePending:
			wantExpired = append(wantExpired, k)
		case idemstore.StateCompleted:
			wantPurged++
		}
	}
	slices.SortFunc(wantExpired, piaKeyCmp)
	for si, s := range stores {
		recs, err := s.ListExpiredLeases(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.SortedFunc(slices.Values(piaKeys(recs)), piaKeyCmp); !slices.Equal(got, wantExpired) {
			t.Fatalf("store %d: ListExpiredLeases: %d keys, want %d", si, len(got), len(wantExpired))
		}
	}
	// Purge through a store opened on the old schema.
	if n, err := writers[1].Purge(ctx, idemstore.PurgeParams{BatchSize: 7}); err != nil || n != wantPurged || n == 0 {
		t.Fatalf("Purge = %d, %v; want %d (> 0)", n, err, wantPurged)
	}
	for k, r := range m {
		if r.state == idemstore.StateCompleted {
			delete(m, k)
			released = append(released, k)
		}
	}
	check("after the purge")
	mfIndexesAgree(t, fresh, migDB, clock.Now())
	mfBulkIntact(t, migDB, bulk, false)
	piaIntegrity(t, migDB)
}

// TestMigrationFaultCancelled: Migrate on a schema-2 file of 20k records
// with a context cancelled before it starts, while it waits for the write
// lock another connection holds, once it holds the lock, and once it has
// held it through 30 polls. Whatever Migrate returns, the file is at
// version 2 with the old indexes or 3 with the new ones, passes
// integrity_check, holds every record; the handle's only connection is not
// left inside a transaction (nor holding the lock: another handle writes);
// and the next Migrate on the same handle succeeds.
func TestMigrationFaultCancelled(t *testing.T) {
	t.Parallel()
	const rows = 20_000
	dir := t.TempDir()
	seed := filepath.Join(dir, "seed.db")
	func() {
		db, err := idemsqlite.Open(seed, idemsqlite.OpenOptions{MaxOpenConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		mfSeed(t, db, rows, true)
	}()
	heldPolls := func(n int) func(*testing.T, *sql.DB, <-chan struct{}) {
		return func(t *testing.T, probe *sql.DB, done <-chan struct{}) {
			for held := 0; held < n; {
				select {
				case <-done:
					return
				default:
				}
				if mfLockHeld(t, probe) { // waits out its busy timeout while the lock is held
					held++
				}
			}
		}
	}
	cases := []struct {
		name string
		// before runs before Migrate starts, and returns what releases
		// whatever it set up, run right after the cancellation.
		before func(t *testing.T, path string) func()
		// wait returns when ctx is to be cancelled, or when Migrate
		// returned (done closed).
		wait func(t *testing.T, probe *sql.DB, done <-chan struct{})
	}{
		{"before it starts", nil, nil},
		{"waiting for the lock", func(t *testing.T, path string) func() {
			other := mfOpen(t, path, idemsqlite.OpenOptions{MaxOpenConns: 1})
			if _, err := other.Exec("BEGIN IMMEDIATE"); err != nil {
				t.Fatal(err)
			}
			return func() {
				if _, err := other.Exec("ROLLBACK"); err != nil {
					t.Error(err)
				}
			}
		}, nil},
		{"holding the lock", nil, heldPolls(1)},
		{"held through 30 polls", nil, heldPolls(30)},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprintf("cancel-%d.db", i))
			mfCopy(t, seed, path)
			// One connection: what Migrate leaves on it is what the next
			// caller of the handle gets.
			db := mfOpen(t, path, idemsqlite.OpenOptions{MaxOpenConns: 1})
			probe := mfOpen(t, path, idemsqlite.OpenOptions{BusyTimeout: time.Millisecond, MaxOpenConns: 1})
			release := func() {}
			if tc.before != nil {
				release = tc.before(t, path)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if tc.wait == nil && tc.before == nil {
				cancel()
			}
			done := make(chan struct{})
			var err error
			go func() {
				defer close(done)
				err = idemsqlite.Migrate(ctx, db)
			}()
			if tc.wait != nil {
				tc.wait(t, probe, done)
			}
			cancel()
			release()
			<-done
			v := mfSchemaEither(t, db)
			t.Logf("Migrate: %v; found at version %d", err, v)
			if err == nil && v != 3 {
				t.Fatalf("Migrate succeeded, yet the file is at version %d", v)
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Migrate's error does not wrap context.Canceled: %v", err)
			}
			// Not left in a transaction: BEGIN on the same connection works.
			if _, err := db.Exec("BEGIN IMMEDIATE"); err != nil {
				t.Fatalf("the handle's connection after the cancelled Migrate: %v", err)
			}
			if _, err := db.Exec("ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			if mfLockHeld(t, probe) {
				t.Fatal("the write lock is still held after the cancelled Migrate")
			}
			piaIntegrity(t, db)
			mfBulkIntact(t, db, rows, true)
			if err := idemsqlite.Migrate(context.Background(), db); err != nil {
				t.Fatalf("the next Migrate: %v", err)
			}
			piaCheckSchema(t, db, piaLatest, piaLatestIndexes)
			piaIntegrity(t, db)
			clock := testenv.NewClock(mfT0)
			s, err := idemsqlite.New(db, idemsqlite.Config{Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			mfIndexesAgree(t, s, db, clock.Now())
			mfStoreWorks(t, s, clock)
		})
	}
}
