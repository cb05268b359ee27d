package idemsqlite_test

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// Tests of migration 0003 (partial secondary indexes) and of the
// statements that rely on them: List by state, ListExpiredLeases and Purge
// must return exactly what a plain scan of the records would, whatever
// schema the records were written under and whatever transitions moved
// them in and out of the partial indexes.

// piaT0 is the fake clock's start, on a whole millisecond.
var piaT0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// piaRec is what a record must look like: the model the store is checked
// against.
type piaRec struct {
	state      idemstore.State
	token      string
	leaseUntil int64 // unix ms
	expiresAt  int64 // unix ms; 0 unless completed
}

type piaModel map[idemstore.Key]*piaRec

func piaKeyCmp(a, b idemstore.Key) int {
	return cmp.Or(strings.Compare(a.Scope, b.Scope), strings.Compare(a.Operation, b.Operation), strings.Compare(a.Key, b.Key))
}

// piaStates are the List filters: all, and each state.
var piaStates = []idemstore.State{"", idemstore.StatePending, idemstore.StateCompleted, idemstore.StateNeedsReview}

// piaExpected returns the model's keys that a listing filtered by state and
// operation, resuming after after (when not nil), must return, in key order.
func (m piaModel) expected(state idemstore.State, op string, after *idemstore.Key) []idemstore.Key {
	var keys []idemstore.Key
	for k, r := range m {
		if (state == "" || r.state == state) && (op == "" || k.Operation == op) && (after == nil || piaKeyCmp(k, *after) > 0) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, piaKeyCmp)
	return keys
}

// piaListAll pages through List with p until the end, checking that every
// page but the last is full, and returns the records in the order listed.
func piaListAll(t *testing.T, s *idemsqlite.Store, p idemstore.ListParams, maxPages int) []*idemstore.Record {
	t.Helper()
	ctx := context.Background()
	var all []*idemstore.Record
	for page := 0; ; page++ {
		if page > maxPages {
			t.Fatalf("List %+v: more than %d pages", p, maxPages)
		}
		lp, err := s.List(ctx, p)
		if err != nil {
			t.Fatalf("List %+v: %v", p, err)
		}
		all = append(all, lp.Records...)
		if lp.NextCursor == "" {
			return all
		}
		if p.Limit > 0 && len(lp.Records) != p.Limit {
			t.Fatalf("List %+v: a page of %d records with a next cursor, want %d", p, len(lp.Records), p.Limit)
		}
		p.Cursor = lp.NextCursor
	}
}

func piaKeys(recs []*idemstore.Record) []idemstore.Key {
	keys := make([]idemstore.Key, len(recs))
	for i, r := range recs {
		keys[i] = r.Key
	}
	return keys
}

// piaSame reports how rec differs from want, or "".
func piaSame(rec *idemstore.Record, want *piaRec) string {
	var wantExp time.Time
	if want.expiresAt != 0 {
		wantExp = time.UnixMilli(want.expiresAt).UTC()
	}
	if rec.State != want.state || rec.Token != want.token || rec.LeaseUntil.UnixMilli() != want.leaseUntil || !rec.ExpiresAt.Equal(wantExp) {
		return fmt.Sprintf("state %s token %q lease %d expires %v; want state %s token %q lease %d expires %v",
			rec.State, rec.Token, rec.LeaseUntil.UnixMilli(), rec.ExpiresAt, want.state, want.token, want.leaseUntil, wantExp)
	}
	return ""
}

// piaCheck checks the store against the model at the clock's now: Get of
// every record, every List (each state filter, each operation and none,
// several page sizes), and ListExpiredLeases (whole and truncated).
func piaCheck(t *testing.T, step string, s *idemsqlite.Store, m piaModel, now time.Time) {
	t.Helper()
	ctx := context.Background()
	for k, want := range m {
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Fatalf("%s: Get %q: %v", step, k, err)
		}
		if d := piaSame(rec, want); d != "" {
			t.Errorf("%s: Get %q: %s", step, k, d)
		}
	}
	ops := []string{"", "no such operation"}
	for k := range m {
		if !slices.Contains(ops, k.Operation) {
			ops = append(ops, k.Operation)
		}
	}
	for _, state := range piaStates {
		for _, op := range ops {
			want := m.expected(state, op, nil)
			for _, limit := range []int{1, 2, 5, 1000} {
				p := idemstore.ListParams{State: state, Operation: op, Limit: limit}
				got := piaListAll(t, s, p, len(m)+2)
				if !slices.Equal(piaKeys(got), want) {
					t.Errorf("%s: List state %q operation %q limit %d:\n got %q\nwant %q", step, state, op, limit, piaKeys(got), want)
					continue
				}
				for _, rec := range got {
					if d := piaSame(rec, m[rec.Key]); d != "" {
						t.Errorf("%s: List state %q: record %q: %s", step, state, rec.Key, d)
					}
				}
			}
		}
	}

	// ListExpiredLeases: the pending records whose lease ended by now,
	// oldest deadline first.
	nowMs := now.UnixMilli()
	var expired []idemstore.Key
	for k, r := range m {
		if r.state == idemstore.StatePending && r.leaseUntil <= nowMs {
			expired = append(expired, k)
		}
	}
	slices.SortFunc(expired, func(a, b idemstore.Key) int {
		return cmp.Or(cmp.Compare(m[a].leaseUntil, m[b].leaseUntil), piaKeyCmp(a, b))
	})
	for _, limit := range []int{1000, 2} {
		recs, err := s.ListExpiredLeases(ctx, limit)
		if err != nil {
			t.Fatalf("%s: ListExpiredLeases(%d): %v", step, limit, err)
		}
		want := expired[:min(limit, len(expired))]
		got := piaKeys(recs)
		// Records with equal deadlines may come in any order among
		// themselves: compare the deadlines in order, and the keys as sets
		// when every deadline is listed.
		var gotLeases, wantLeases []int64
		for _, r := range recs {
			gotLeases = append(gotLeases, r.LeaseUntil.UnixMilli())
		}
		for _, k := range want {
			wantLeases = append(wantLeases, m[k].leaseUntil)
		}
		sortedGot := slices.SortedFunc(slices.Values(got), piaKeyCmp)
		sortedWant := slices.SortedFunc(slices.Values(want), piaKeyCmp)
		if !slices.Equal(gotLeases, wantLeases) || (limit >= len(expired) && !slices.Equal(sortedGot, sortedWant)) {
			t.Errorf("%s: ListExpiredLeases(%d) at %d:\n got %q leases %v\nwant %q leases %v", step, limit, nowMs, got, gotLeases, want, wantLeases)
		}
		for _, rec := range recs {
			want, ok := m[rec.Key]
			if !ok {
				t.Errorf("%s: ListExpiredLeases returned %q, which should not exist", step, rec.Key)
				continue
			}
			if d := piaSame(rec, want); d != "" {
				t.Errorf("%s: ListExpiredLeases: record %q: %s", step, rec.Key, d)
			}
			if rec.State != idemstore.StatePending || !rec.LeaseExpired() {
				t.Errorf("%s: ListExpiredLeases returned %q in state %s, lease expired %v", step, rec.Key, rec.State, rec.LeaseExpired())
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// piaIntegrity runs PRAGMA integrity_check, which also checks that every
// partial index holds exactly the rows its WHERE clause selects.
func piaIntegrity(t *testing.T, db *sql.DB) {
	t.Helper()
	msgs := queryColumn[string](t, db, "PRAGMA integrity_check")
	if len(msgs) != 1 || msgs[0] != "ok" {
		t.Fatalf("integrity_check: %q", msgs)
	}
}

// piaSchema returns the recorded schema versions and the named indexes of
// idem_records, in order.
func piaSchema(t *testing.T, db *sql.DB) (versions []int, indexes []string) {
	t.Helper()
	versions = queryColumn[int](t, db, "SELECT version FROM idem_schema_migrations ORDER BY version")
	indexes = queryColumn[string](t, db, `SELECT name FROM sqlite_schema
		WHERE type = 'index' AND tbl_name = 'idem_records' AND name LIKE 'idem_records_%' ORDER BY name`)
	return versions, indexes
}

// queryColumn returns the single column of every row q returns.
func queryColumn[T any](t *testing.T, db *sql.DB, q string) []T {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	piaV2Indexes = []string{"idem_records_expiry", "idem_records_lease", "idem_records_state_key"}
	// The schema this build migrates to: its versions and named indexes.
	piaLatest        = []int{1, 2, 3, 4, 5}
	piaLatestIndexes = []string{"idem_records_completed_expiry", "idem_records_created", "idem_records_key_value",
		"idem_records_label", "idem_records_open_created", "idem_records_pending_lease"}
)

func piaCheckSchema(t *testing.T, db *sql.DB, wantVersions []int, wantIndexes []string) {
	t.Helper()
	versions, indexes := piaSchema(t, db)
	if !slices.Equal(versions, wantVersions) || !slices.Equal(indexes, wantIndexes) {
		t.Fatalf("schema versions %v indexes %q; want versions %v indexes %q", versions, indexes, wantVersions, wantIndexes)
	}
}

// piaBuildV2 brings db to schema version 2 by hand, as an idem of before
// migration 0003 left it.
func piaBuildV2(t *testing.T, db *sql.DB) {
	t.Helper()
	stmts := []string{`CREATE TABLE idem_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`}
	for i, f := range []string{"0001_init", "0002_updated_request"} {
		b, err := os.ReadFile("migrations/" + f + ".sql")
		if err != nil {
			t.Fatal(err)
		}
		stmts = append(stmts, string(b), fmt.Sprintf(`INSERT INTO idem_schema_migrations VALUES (%d, '%s', 0)`, i+1, f))
	}
	for _, stmt := range stmts {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	piaCheckSchema(t, db, []int{1, 2}, piaV2Indexes)
}

// piaSeedV2 writes n records under schema 2, in an order unrelated to
// their keys and deadlines, in every state: pending with an expired lease
// (one ending exactly now) and a live one, completed expired (one exactly
// now) and not, needs_review with an expired lease and a live one. It
// returns the model of what it wrote.
func piaSeedV2(t *testing.T, db *sql.DB, n int) piaModel {
	t.Helper()
	now := piaT0.UnixMilli()
	scopes := []string{"tenant-a", "tenant-b"}
	ops := []string{"POST /a", "POST /b", "PUT /c"}
	m := piaModel{}
	resp := idemstore.EncodeResponse(&idemstore.Response{Status: 201, Body: []byte("done")})
	req := idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/a"})
	for j := range n {
		i := (j * 7) % n // insertion order unrelated to key order
		k := idemstore.Key{Scope: scopes[(i/2)%2], Operation: ops[(i/6)%3], Key: fmt.Sprintf("k-%03d", i)}
		// Deadlines unrelated to key order, distinct within each state,
		// the first of each state's expired ones exactly now.
		off := int64(((i/6)*5)%(n/6)) * 1000
		r := &piaRec{token: fmt.Sprintf("tok-%d", i)}
		var response []byte
		switch i % 6 {
		case 0:
			r.state, r.leaseUntil = idemstore.StatePending, now-off
		case 1:
			r.state, r.leaseUntil = idemstore.StatePending, now+1000+off
		case 2:
			r.state, r.leaseUntil, r.expiresAt = idemstore.StateCompleted, now-3600_000, now-off
		case 3:
			r.state, r.leaseUntil, r.expiresAt = idemstore.StateCompleted, now-3600_000, now+1000+off
		case 4:
			r.state, r.leaseUntil = idemstore.StateNeedsReview, now-off
		case 5:
			r.state, r.leaseUntil = idemstore.StateNeedsReview, now+1000+off
		}
		var expires any
		if r.state == idemstore.StateCompleted {
			expires, response = r.expiresAt, resp
		}
		if _, err := db.Exec(`INSERT INTO idem_records
			(scope, operation, "key", fingerprint, state, token, lease_until, response, reason, created_at, expires_at, updated_at, request)
			VALUES (?, ?, ?, 'fp', ?, ?, ?, ?, '', ?, ?, ?, ?)`,
			k.Scope, k.Operation, k.Key, string(r.state), r.token, r.leaseUntil, response, now-7200_000, expires, now-7200_000, req); err != nil {
			t.Fatal(err)
		}
		m[k] = r
	}
	return m
}

// TestPartialIndexAttackUpgradeFromSchema2: records written under schema 2
// in every state are, after New applies migration 0003, each readable,
// listed by every state filter exactly (also by operation and across small
// pages), found as expired leases exactly and oldest first, and purged
// exactly when completed and expired; and the upgraded store keeps working.
func TestPartialIndexAttackUpgradeFromSchema2(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t, idemsqlite.OpenOptions{})
	piaBuildV2(t, db)
	m := piaSeedV2(t, db, 48)
	clock := testenv.NewClock(piaT0)
	s, err := idemsqlite.New(db, idemsqlite.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	piaCheckSchema(t, db, piaLatest, piaLatestIndexes)
	piaIntegrity(t, db)
	piaCheck(t, "after migration", s, m, clock.Now())

	var wantPurged int
	for k, r := range m {
		if r.state == idemstore.StateCompleted && r.expiresAt <= clock.Now().UnixMilli() {
			delete(m, k)
			wantPurged++
		}
	}
	if wantPurged != 8 {
		t.Fatalf("the seed has %d expired completed records, want 8", wantPurged)
	}
	var progress []int
	n, err := s.Purge(ctx, idemstore.PurgeParams{BatchSize: 3, Progress: func(d int) { progress = append(progress, d) }})
	if err != nil || n != wantPurged || !slices.Equal(progress, []int{3, 6, 8}) {
		t.Fatalf("Purge = %d, %v (progress %v); want %d (progress [3 6 8])", n, err, progress, wantPurged)
	}
	piaCheck(t, "after purge", s, m, clock.Now())
	if n, err := s.Purge(ctx, idemstore.PurgeParams{}); n != 0 || err != nil {
		t.Fatalf("second Purge = %d, %v; want 0", n, err)
	}

	// The upgraded store keeps moving records between the indexes.
	expired, err := s.ListExpiredLeases(ctx, 3)
	if err != nil || len(expired) != 3 {
		t.Fatalf("ListExpiredLeases(3) = %d records, %v", len(expired), err)
	}
	take, esc, rel := expired[0].Key, expired[1].Key, expired[2].Key
	if err := s.Takeover(ctx, idemstore.TakeoverParams{Key: take, OldToken: m[take].token, NewToken: "new", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	m[take].token, m[take].leaseUntil = "new", clock.Now().Add(time.Minute).UnixMilli()
	if err := s.Escalate(ctx, idemstore.EscalateParams{Key: esc, Token: m[esc].token, Reason: "crashed", IfExpired: true}); err != nil {
		t.Fatal(err)
	}
	m[esc].state = idemstore.StateNeedsReview
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: rel, Token: m[rel].token, IfExpired: true}); err != nil {
		t.Fatal(err)
	}
	delete(m, rel)
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: take, Token: "new", Response: &idemstore.Response{Status: 200}, Retention: -time.Second}); err != nil {
		t.Fatal(err)
	}
	m[take].state, m[take].expiresAt = idemstore.StateCompleted, clock.Now().Add(-time.Second).UnixMilli()
	piaCheck(t, "after transitions on the upgraded store", s, m, clock.Now())
	if n, err := s.Purge(ctx, idemstore.PurgeParams{}); n != 1 || err != nil {
		t.Fatalf("Purge after completing with negative retention = %d, %v; want 1", n, err)
	}
	delete(m, take)
	piaCheck(t, "after the last purge", s, m, clock.Now())
	piaIntegrity(t, db)
}

// TestPartialIndexAttackConcurrentMigrate: several *sql.DB on one file,
// each with its own connections, migrate at once, from a schema-2 file
// with records and from an empty file: every Migrate succeeds (migration
// 0003 run twice would fail on its CREATE INDEX), the versions are 1, 2, 3
// once each, the indexes are the three partial ones, and the records are
// intact.
func TestPartialIndexAttackConcurrentMigrate(t *testing.T) {
	t.Parallel()
	for _, from := range []string{"schema 2", "empty"} {
		t.Run(from, func(t *testing.T) {
			t.Parallel()
			for round := range 4 {
				path := filepath.Join(t.TempDir(), fmt.Sprintf("idem-%d.db", round))
				const migrators = 3
				dbs := make([]*sql.DB, migrators)
				for i := range dbs {
					db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { db.Close() })
					dbs[i] = db
				}
				var m piaModel
				if from == "schema 2" {
					piaBuildV2(t, dbs[0])
					m = piaSeedV2(t, dbs[0], 24)
				}
				start := make(chan struct{})
				errs := make([]error, migrators)
				var wg sync.WaitGroup
				for i, db := range dbs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						if i == 0 {
							// One of them through New, as a process starting up would.
							_, errs[i] = idemsqlite.New(db, idemsqlite.Config{})
							return
						}
						errs[i] = idemsqlite.Migrate(context.Background(), db)
					}()
				}
				close(start)
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("round %d: migrator %d: %v", round, i, err)
					}
				}
				for _, db := range dbs {
					piaCheckSchema(t, db, piaLatest, piaLatestIndexes)
				}
				var applied3 int
				if err := dbs[1].QueryRow(`SELECT count(*) FROM idem_schema_migrations WHERE version = 3 AND name = '0003_partial_indexes'`).Scan(&applied3); err != nil || applied3 != 1 {
					t.Fatalf("round %d: version 3 recorded %d times, %v", round, applied3, err)
				}
				piaIntegrity(t, dbs[2])
				if m != nil {
					s, err := idemsqlite.New(dbs[2], idemsqlite.Config{Now: testenv.NewClock(piaT0).Now})
					if err != nil {
						t.Fatal(err)
					}
					piaCheck(t, fmt.Sprintf("round %d", round), s, m, piaT0)
				}
			}
		})
	}
}

// TestPartialIndexAttackFailedMigrationRollsBack: when a statement of
// migration 0003 fails after it has already dropped and created indexes,
// the whole migration rolls back: the schema-2 indexes are all there, none
// of the new ones, the version stays 2, and a later Migrate, once the
// obstacle is gone, applies it.
func TestPartialIndexAttackFailedMigrationRollsBack(t *testing.T) {
	t.Parallel()
	db := openDB(t, idemsqlite.OpenOptions{})
	piaBuildV2(t, db)
	m := piaSeedV2(t, db, 12)
	// An application's own index that takes the name of the last index
	// the migration creates.
	for _, stmt := range []string{
		`CREATE TABLE app_things (x INTEGER)`,
		`CREATE INDEX idem_records_open_key ON app_things (x)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := idemsqlite.New(db, idemsqlite.Config{}); err == nil {
		t.Fatal("New succeeded although migration 0003 cannot create idem_records_open_key")
	}
	piaCheckSchema(t, db, []int{1, 2}, piaV2Indexes)
	piaIntegrity(t, db)
	if _, err := db.Exec(`DROP INDEX idem_records_open_key`); err != nil {
		t.Fatal(err)
	}
	clock := testenv.NewClock(piaT0)
	s, err := idemsqlite.New(db, idemsqlite.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	piaCheckSchema(t, db, piaLatest, piaLatestIndexes)
	piaCheck(t, "after the retried migration", s, m, clock.Now())
	piaIntegrity(t, db)
}

// TestPartialIndexAttackTransitions moves records through every transition
// that takes them into or out of a partial index (reserve, escalate,
// resolve, release, complete, lease expiry, takeover, extend, purge,
// delete, reserve again), on a fake clock, and after each checks Get, List
// by every state and ListExpiredLeases against a model; refused
// transitions change nothing.
func TestPartialIndexAttackTransitions(t *testing.T) {
	t.Parallel()
	for _, mode := range batchModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := testenv.NewClock(piaT0)
			cfg := mode.cfg
			cfg.Now = clock.Now
			s, db := newStoreWith(t, cfg)
			m := piaModel{}
			now := func() int64 { return clock.Now().UnixMilli() }
			key := func(op, k string) idemstore.Key { return idemstore.Key{Scope: "tenant", Operation: op, Key: k} }
			a, b, c := key("POST /t", "a"), key("POST /t", "b"), key("POST /t", "c")
			d, e, f := key("POST /u", "d"), key("POST /u", "e"), key("POST /u", "f")
			resp := &idemstore.Response{Status: 200, Body: []byte("ok")}
			must := func(step string, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
			}
			reserve := func(k idemstore.Key, tok string, lease time.Duration) {
				t.Helper()
				rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: lease})
				if err != nil || !created {
					t.Fatalf("Reserve %q: created %v, %v, %+v", k, created, err, rec)
				}
				m[k] = &piaRec{state: idemstore.StatePending, token: tok, leaseUntil: now() + lease.Milliseconds()}
			}
			check := func(step string) { t.Helper(); piaCheck(t, step, s, m, clock.Now()) }

			reserve(a, "ta", 10*time.Second)
			reserve(b, "tb", 5*time.Second)
			reserve(c, "tc", 20*time.Second)
			reserve(d, "td", time.Second)
			reserve(e, "te", 30*time.Second)
			check("reserved")

			must("escalate a", s.Escalate(ctx, idemstore.EscalateParams{Key: a, Token: "ta", Reason: "unknown"}))
			m[a].state = idemstore.StateNeedsReview
			check("a escalated")
			must("resolve a", s.Resolve(ctx, idemstore.ResolveParams{Key: a, Action: idemstore.ResolveComplete, Response: resp, Retention: time.Minute}))
			m[a].state, m[a].expiresAt = idemstore.StateCompleted, now()+60_000
			check("a resolved complete")

			reserve(f, "tf", time.Minute)
			must("escalate f", s.Escalate(ctx, idemstore.EscalateParams{Key: f, Token: "tf", Reason: "unknown"}))
			m[f].state = idemstore.StateNeedsReview
			check("f escalated")
			must("resolve f", s.Resolve(ctx, idemstore.ResolveParams{Key: f, Action: idemstore.ResolveRelease, Token: "tf"}))
			delete(m, f)
			check("f resolved release")

			must("release b", s.Release(ctx, idemstore.ReleaseParams{Key: b, Token: "tb"}))
			delete(m, b)
			check("b released")
			must("complete c", s.Complete(ctx, idemstore.CompleteParams{Key: c, Token: "tc", Response: resp, Retention: 30 * time.Second}))
			m[c].state, m[c].expiresAt = idemstore.StateCompleted, now()+30_000
			check("c completed")

			clock.Advance(2 * time.Second) // d's lease ends
			check("d expired")
			must("takeover d", s.Takeover(ctx, idemstore.TakeoverParams{Key: d, OldToken: "td", NewToken: "td2", Lease: 10 * time.Second}))
			m[d].token, m[d].leaseUntil = "td2", now()+10_000
			check("d taken over")
			if err := s.Takeover(ctx, idemstore.TakeoverParams{Key: d, OldToken: "td2", NewToken: "td3", Lease: time.Second}); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("takeover of a live lease: %v, want ErrLeaseLost", err)
			}
			check("takeover of a live lease refused")

			clock.Advance(10 * time.Second) // d's lease ends exactly now
			check("d expired exactly now")
			must("extend d", s.Extend(ctx, idemstore.ExtendParams{Key: d, Token: "td2", Lease: 10 * time.Second}))
			m[d].leaseUntil = now() + 10_000
			check("d extended")

			clock.Advance(19 * time.Second) // e's lease, d's lease and c's retention end
			check("d and e expired, c purgeable")
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: a, Token: "ta", Response: resp}); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("complete of a completed record: %v, want ErrLeaseLost", err)
			}
			must("escalate e if expired", s.Escalate(ctx, idemstore.EscalateParams{Key: e, Token: "te", Reason: "timed out", IfExpired: true}))
			m[e].state = idemstore.StateNeedsReview
			check("e escalated")
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: e, Token: "te", Response: resp}); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("complete of a needs_review record: %v, want ErrLeaseLost", err)
			}
			if err := s.Delete(ctx, idemstore.DeleteParams{Key: e}); !errors.Is(err, idemstore.ErrNotCompleted) {
				t.Fatalf("delete of a needs_review record: %v, want ErrNotCompleted", err)
			}
			check("refused changes to e")
			must("release d if expired", s.Release(ctx, idemstore.ReleaseParams{Key: d, Token: "td2", IfExpired: true}))
			delete(m, d)
			check("d released")

			if n, err := s.Purge(ctx, idemstore.PurgeParams{}); n != 1 || err != nil {
				t.Fatalf("Purge = %d, %v; want 1 (c)", n, err)
			}
			delete(m, c)
			check("c purged")
			clock.Advance(29 * time.Second) // a's retention ends exactly now
			if n, err := s.Purge(ctx, idemstore.PurgeParams{BatchSize: 1}); n != 1 || err != nil {
				t.Fatalf("Purge = %d, %v; want 1 (a)", n, err)
			}
			delete(m, a)
			check("a purged")

			reserve(a, "ta2", 0) // expired at once
			reserve(b, "tb2", time.Minute)
			check("a and b reserved again")
			must("resolve e", s.Resolve(ctx, idemstore.ResolveParams{Key: e, Action: idemstore.ResolveRelease}))
			delete(m, e)
			must("complete b", s.Complete(ctx, idemstore.CompleteParams{Key: b, Token: "tb2", Response: resp, Retention: time.Hour}))
			m[b].state, m[b].expiresAt = idemstore.StateCompleted, now()+3600_000
			check("e released, b completed")
			must("delete b", s.Delete(ctx, idemstore.DeleteParams{Key: b}))
			delete(m, b)
			check("b deleted")
			if n, err := s.Purge(ctx, idemstore.PurgeParams{}); n != 0 || err != nil {
				t.Fatalf("Purge with a pending record whose lease expired = %d, %v; want 0", n, err)
			}
			check("nothing purged")
			if len(m) != 1 || m[a] == nil {
				t.Fatalf("model at the end: %v", m)
			}
			piaIntegrity(t, db)
		})
	}
}

// TestPartialIndexAttackUnusualKeys: keys with NUL bytes, invalid UTF-8,
// quotes, LIKE wildcards, trailing spaces, case and normalization
// variants, prefixes of one another, empty parts and the longest allowed
// parts, in every state, are listed in byte order by every filter and
// page size, and a cursor after any key, stored or not, resumes exactly
// after it whatever the state filter.
func TestPartialIndexAttackUnusualKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := testenv.NewClock(piaT0)
	s, db := newStoreWith(t, idemsqlite.Config{Now: clock.Now, DisableBatch: true})
	m := piaModel{}
	parts := []string{
		"", "a", "a\x00", "a\x00b", "a\x01", "a ", "a  ", "ab", "A", "b",
		"\xff", "\xff\xfe", "\xc3", "é", "e\u0301", "日本", "\U0001F600",
		"'; DROP TABLE idem_records; --", "%", "_", `"`, "completed",
		strings.Repeat("k", idemstore.MaxKeyLength),
	}
	var keys []idemstore.Key
	for i, p := range parts {
		keys = append(keys, idemstore.Key{Scope: "s", Operation: "POST /x", Key: p})
		if i%3 == 0 && p != "" {
			keys = append(keys, idemstore.Key{Scope: "s" + p, Operation: "POST /x", Key: "k"})
			keys = append(keys, idemstore.Key{Scope: "s", Operation: "POST /x" + p, Key: p})
		}
	}
	keys = append(keys,
		idemstore.Key{},
		idemstore.Key{Scope: strings.Repeat("s", idemstore.MaxScopeLength), Operation: strings.Repeat("o", idemstore.MaxOperationLength), Key: strings.Repeat("k", idemstore.MaxKeyLength)},
	)
	resp := &idemstore.Response{Status: 200}
	for i, k := range keys {
		if _, dup := m[k]; dup {
			t.Fatalf("duplicate test key %q", k)
		}
		tok := fmt.Sprintf("t%d", i)
		lease := time.Duration(i%5-2) * time.Second // some expired, one exactly now
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: lease}); err != nil || !created {
			t.Fatalf("Reserve %q: %v, %v", k, created, err)
		}
		r := &piaRec{state: idemstore.StatePending, token: tok, leaseUntil: clock.Now().Add(lease).UnixMilli()}
		switch i % 3 {
		case 1:
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: resp, Retention: time.Duration(i%2) * time.Hour}); err != nil {
				t.Fatal(err)
			}
			r.state, r.expiresAt = idemstore.StateCompleted, clock.Now().Add(time.Duration(i%2)*time.Hour).UnixMilli()
		case 2:
			if err := s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: "?"}); err != nil {
				t.Fatal(err)
			}
			r.state = idemstore.StateNeedsReview
		}
		m[k] = r
	}
	piaCheck(t, "unusual keys", s, m, clock.Now())

	// A cursor after any key, stored or not, resumes right after it.
	afters := slices.Clone(keys)
	afters = append(afters,
		idemstore.Key{Scope: "s", Operation: "POST /x", Key: "a\x00\x00"},
		idemstore.Key{Scope: "s", Operation: "POST /x\x00", Key: ""},
		idemstore.Key{Scope: "r", Operation: "\xff", Key: "\xff"},
		idemstore.Key{Scope: "\xff\xff", Operation: "", Key: ""},
	)
	for _, after := range afters {
		for _, state := range piaStates {
			p := idemstore.ListParams{State: state, Cursor: idemstore.EncodeKeyCursor(after), Limit: 3}
			got := piaKeys(piaListAll(t, s, p, len(m)+2))
			if want := m.expected(state, "", &after); !slices.Equal(got, want) {
				t.Errorf("List state %q after %q:\n got %q\nwant %q", state, after, got, want)
			}
		}
	}

	// Purge takes exactly the expired completed ones.
	var wantPurged int
	for k, r := range m {
		if r.state == idemstore.StateCompleted && r.expiresAt <= clock.Now().UnixMilli() {
			delete(m, k)
			wantPurged++
		}
	}
	if n, err := s.Purge(ctx, idemstore.PurgeParams{BatchSize: 2}); n != wantPurged || err != nil {
		t.Fatalf("Purge = %d, %v; want %d", n, err, wantPurged)
	}
	piaCheck(t, "unusual keys after purge", s, m, clock.Now())
	piaIntegrity(t, db)
}

// TestPartialIndexAttackUnknownState: a List filter that is not one of the
// three states, however close to one (case, spaces, NUL, SQL), is an error,
// not a listing; in particular never one of the records not completed,
// which the partial index's literal term would otherwise let through.
func TestPartialIndexAttackUnknownState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, db := newStore(t)
	for i, st := range []idemstore.State{idemstore.StatePending, idemstore.StateCompleted, idemstore.StateNeedsReview} {
		k := idemstore.Key{Scope: "s", Operation: "o", Key: string(st)}
		tok := fmt.Sprint(i)
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Token: tok, Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		switch st {
		case idemstore.StateCompleted:
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
		case idemstore.StateNeedsReview:
			if err := s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, st := range []idemstore.State{
		"Pending", "PENDING", "pending ", " pending", "pending\x00", "Completed", "completed ",
		"needs-review", "needs_review\n", "expired", "released", "all", "*", "%",
		"completed' OR 'a'='a", "pending' OR 1=1 --",
	} {
		page, err := s.List(ctx, idemstore.ListParams{State: st})
		if err == nil || len(page.Records) != 0 {
			t.Errorf("List state %q = %d records, %v; want an error", st, len(page.Records), err)
		}
	}
	for _, st := range piaStates {
		page, err := s.List(ctx, idemstore.ListParams{State: st})
		want := 1
		if st == "" {
			want = 3
		}
		if err != nil || len(page.Records) != want {
			t.Errorf("List state %q = %d records, %v; want %d", st, len(page.Records), err, want)
		}
	}
	piaIntegrity(t, db)
}
