package idempg

// Attacks on migration 005 (the partial index of open records) and on the
// listings that read it: the upgrade of a populated schema at version 4,
// an index built beforehand with CREATE INDEX CONCURRENTLY (as the
// migration asks for on a large table), the plans of the admin listings as
// prepared statements, and the scripts that know the schema's indexes.
//
// The plan tests load oaSmallRecords records; with IDEM_ATTACK_LARGE=1 they
// load oaLargeRecords instead (about 5 s more); IDEM_ATTACK_PLANS=1 logs
// every plan.

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/migrations"
	"github.com/idem-dev/idem/internal/testenv"
)

const (
	oaSmallRecords = 20_000
	oaLargeRecords = 200_000
)

// oaPool returns a pool of its own for one test (closed in cleanup).
func oaPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// oaSchemaAt creates a schema of its own migrated to version upTo, as
// Migrate would have left it then: the migrations' files applied with
// {schema} replaced and one idem_schema_migrations row each. The schema is
// dropped in cleanup.
func oaSchemaAt(t *testing.T, pool *pgxpool.Pool, upTo int) string {
	t.Helper()
	ctx := context.Background()
	schema := fmt.Sprintf("idem_t_oa_%d", time.Now().UnixNano())
	quoted := pgx.Identifier{schema}.Sanitize()
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+quoted+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	ms, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, sql := range []string{
			"CREATE SCHEMA " + quoted,
			"CREATE TABLE " + quoted + ".idem_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
		} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		for _, m := range ms {
			if m.Version > upTo {
				break
			}
			if _, err := tx.Exec(ctx, strings.ReplaceAll(m.SQL, "{schema}", quoted)); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+quoted+".idem_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return schema
}

type oaIndex struct {
	def          string
	valid, ready bool
}

// oaIndexes returns the indexes of schema's idem_records by name.
func oaIndexes(t *testing.T, pool *pgxpool.Pool, schema string) map[string]oaIndex {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisready
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass($1)`, pgx.Identifier{schema, "idem_records"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]oaIndex{}
	var (
		name string
		ix   oaIndex
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &ix.def, &ix.valid, &ix.ready}, func() error {
		m[name] = ix
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

// oaVersions returns the versions idem_schema_migrations lists, in order.
func oaVersions(t *testing.T, pool *pgxpool.Pool, schema string) []int32 {
	t.Helper()
	rows, _ := pool.Query(context.Background(), "SELECT version FROM "+pgx.Identifier{schema, "idem_schema_migrations"}.Sanitize()+" ORDER BY version")
	v, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// oaCheckOpenIndex fails t unless schema has a valid, ready partial index
// of open records named idem_records_open_key and no idem_records_state_key.
func oaCheckOpenIndex(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	ix := oaIndexes(t, pool, schema)
	if _, ok := ix["idem_records_state_key"]; ok {
		t.Errorf("idem_records_state_key is still there after migration 005")
	}
	open, ok := ix["idem_records_open_key"]
	switch {
	case !ok:
		t.Errorf("no idem_records_open_key after migration 005; indexes: %v", ix)
	case !open.valid || !open.ready:
		t.Errorf("idem_records_open_key is there but not usable (indisvalid %v, indisready %v): the planner never reads it, and the index of states is gone: %s",
			open.valid, open.ready, open.def)
	case !strings.Contains(open.def, "(state, scope, operation, key)") || !strings.Contains(open.def, "WHERE (state <> 'completed'::text)"):
		t.Errorf("idem_records_open_key has another definition: %s", open.def)
	}
}

// oaRec is what the upgrade test knows of a record it wrote.
type oaRec struct {
	scope, op, key, state string
	created               time.Time
}

func (r oaRec) k() idemstore.Key { return idemstore.Key{Scope: r.scope, Operation: r.op, Key: r.key} }

// oaFill writes records in all three states across scopes and operations,
// with ties of created_at, keys that share prefixes across scopes, a
// LIKE wildcard and a multi-byte key, and returns them as a plain SELECT
// reads them.
func oaFill(t *testing.T, pool *pgxpool.Pool, schema string) []oaRec {
	t.Helper()
	ctx := context.Background()
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, operation, key, fingerprint, state, token, lease_until, response, reason, created_at, updated_at, expires_at)
SELECT 's' || (i % 4), 'op' || (i % 3),
    CASE WHEN i % 97 = 0 THEN 'k_%' || i WHEN i % 89 = 0 THEN 'kë-' || i ELSE 'k-' || lpad((i / 4)::text, 4, '0') END,
    'fp', x.s, 'tok-' || i,
    CASE WHEN i % 14 = 0 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,
    CASE WHEN x.s = 'completed' THEN $1::bytea END,
    CASE WHEN x.s = 'needs_review' THEN 'upstream timeout ' || i ELSE '' END,
    timestamptz '2030-01-01 00:00:00+00' + (i / 3) * interval '1 second', now(),
    CASE WHEN x.s = 'completed' THEN now() + interval '1 day' END
FROM generate_series(1, 600) i,
LATERAL (SELECT CASE WHEN i % 5 = 0 THEN 'needs_review' WHEN i % 7 = 0 THEN 'pending' ELSE 'completed' END AS s) x`,
		idemstore.EncodeResponse(&idemstore.Response{Status: 201}))
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := pool.Query(ctx, "SELECT scope, operation, key, state, created_at FROM "+table)
	var (
		recs []oaRec
		r    oaRec
	)
	if _, err := pgx.ForEachRow(rows, []any{&r.scope, &r.op, &r.key, &r.state, &r.created}, func() error {
		r.created = r.created.UTC()
		recs = append(recs, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return recs
}

// oaListCases are the listings the upgrade test compares.
func oaListCases() []idemstore.ListParams {
	var ps []idemstore.ListParams
	for _, st := range []idemstore.State{"", idemstore.StatePending, idemstore.StateCompleted, idemstore.StateNeedsReview} {
		for _, o := range []idemstore.Order{idemstore.OrderKey, idemstore.OrderOldest, idemstore.OrderNewest} {
			for _, f := range []idemstore.ListParams{{}, {Operation: "op1"}, {Key: "k-0010"}, {KeyPrefix: "k-00"}, {KeyPrefix: "k_%"}, {KeyPrefix: "kë"}, {Operation: "op2", KeyPrefix: "k-01"}} {
				f.State, f.Order, f.Limit = st, o, 7
				ps = append(ps, f)
			}
		}
	}
	return ps
}

// oaExpect lists recs as p asks, from what the test wrote.
func oaExpect(recs []oaRec, p idemstore.ListParams) []string {
	var sel []oaRec
	for _, r := range recs {
		if (p.State == "" || r.state == string(p.State)) && (p.Operation == "" || r.op == p.Operation) &&
			(p.Key == "" || r.key == p.Key) && strings.HasPrefix(r.key, p.KeyPrefix) {
			sel = append(sel, r)
		}
	}
	byKey := func(a, b oaRec) int {
		return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.op, b.op), cmp.Compare(a.key, b.key))
	}
	switch {
	case p.Order == idemstore.OrderOldest:
		slices.SortFunc(sel, func(a, b oaRec) int { return cmp.Or(a.created.Compare(b.created), byKey(a, b)) })
	case p.Order == idemstore.OrderNewest:
		slices.SortFunc(sel, func(a, b oaRec) int { return -cmp.Or(a.created.Compare(b.created), byKey(a, b)) })
	case p.ByKeyValue():
		slices.SortFunc(sel, func(a, b oaRec) int {
			return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.scope, b.scope), cmp.Compare(a.op, b.op))
		})
	default:
		slices.SortFunc(sel, byKey)
	}
	out := make([]string, len(sel))
	for i, r := range sel {
		out[i] = r.state + " " + oaKeyString(r.k())
	}
	return out
}

func oaKeyString(k idemstore.Key) string { return fmt.Sprintf("%q/%q/%q", k.Scope, k.Operation, k.Key) }

// oaListAll pages through s.List(p) to the end.
func oaListAll(t *testing.T, s *Store, p idemstore.ListParams) []string {
	t.Helper()
	var out []string
	for range 1000 {
		page, err := s.List(context.Background(), p)
		if err != nil {
			t.Fatalf("List %+v: %v", p, err)
		}
		for _, r := range page.Records {
			out = append(out, string(r.State)+" "+oaKeyString(r.Key))
		}
		if page.NextCursor == "" {
			return out
		}
		p.Cursor = page.NextCursor
	}
	t.Fatalf("List %+v: more than 1000 pages", p)
	return nil
}

type oaSnapshot struct {
	lists  map[string][]string
	counts idemstore.Counts
}

func oaSnap(t *testing.T, s *Store, recs []oaRec) oaSnapshot {
	t.Helper()
	snap := oaSnapshot{lists: map[string][]string{}}
	for _, p := range oaListCases() {
		name := fmt.Sprintf("%+v", p)
		got := oaListAll(t, s, p)
		if want := oaExpect(recs, p); !slices.Equal(got, want) {
			t.Errorf("List %s:\n got %d %q\nwant %d %q", name, len(got), got, len(want), want)
		}
		// One page of everything: the same records as the pages.
		one := p
		one.Limit = 1000
		if got1 := oaListAll(t, s, one); !slices.Equal(got1, got) {
			t.Errorf("List %s: one page of 1000 differs from pages of 7:\n%q\n%q", name, got1, got)
		}
		snap.lists[name] = got
	}
	c, err := s.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var want idemstore.Counts
	ops := map[string]*idemstore.OperationCounts{}
	for _, r := range recs {
		if r.state == string(idemstore.StateCompleted) {
			want.Completed++
			continue
		}
		if ops[r.op] == nil {
			ops[r.op] = &idemstore.OperationCounts{Operation: r.op}
		}
		if r.state == string(idemstore.StatePending) {
			want.Pending++
			ops[r.op].Pending++
		} else {
			want.NeedsReview++
			ops[r.op].NeedsReview++
			if want.OldestNeedsReview.IsZero() || r.created.Before(want.OldestNeedsReview) {
				want.OldestNeedsReview = r.created
			}
		}
	}
	for _, oc := range ops {
		want.Operations = append(want.Operations, *oc)
	}
	slices.SortFunc(want.Operations, func(a, b idemstore.OperationCounts) int { return cmp.Compare(a.Operation, b.Operation) })
	if c.Pending != want.Pending || c.NeedsReview != want.NeedsReview || c.Completed != want.Completed || c.CompletedEstimated ||
		!c.OldestNeedsReview.Equal(want.OldestNeedsReview) || !slices.Equal(c.Operations, want.Operations) {
		t.Errorf("Counts: got %+v\nwant %+v", c, want)
	}
	c.ReadAt = time.Time{}
	snap.counts = c
	return snap
}

// TestOpenKeyAttackUpgradeFrom004 migrates a populated schema at version 4
// to 5 and 6: every listing (each state filter and order, pages of 7 with
// cursors, by operation, key and key prefix) and Counts must return the
// same records before and after, and what the test wrote; the index of
// states must be replaced by a valid index of open records; Migrate again
// must change nothing.
func TestOpenKeyAttackUpgradeFrom004(t *testing.T) {
	pool := oaPool(t, 8)
	ctx := context.Background()
	schema := oaSchemaAt(t, pool, 4)
	if v := oaVersions(t, pool, schema); !slices.Equal(v, []int32{1, 2, 3, 4}) {
		t.Fatalf("versions %v before the upgrade", v)
	}
	if _, ok := oaIndexes(t, pool, schema)["idem_records_state_key"]; !ok {
		t.Fatal("no idem_records_state_key at version 4")
	}
	recs := oaFill(t, pool, schema)
	s, err := New(pool, Config{Schema: schema, DisableBatch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := oaSnap(t, s, recs)

	if err := Migrate(ctx, pool, Config{Schema: schema}); err != nil {
		t.Fatalf("Migrate from 4: %v", err)
	}
	if v := oaVersions(t, pool, schema); !slices.Equal(v, []int32{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("versions %v after the upgrade", v)
	}
	oaCheckOpenIndex(t, pool, schema)
	// The same pool: the store's prepared statements were planned with
	// the old index, which is gone.
	after := oaSnap(t, s, recs)
	for name, b := range before.lists {
		if a := after.lists[name]; !slices.Equal(a, b) {
			t.Errorf("List %s changed with the upgrade:\nbefore %q\nafter  %q", name, b, a)
		}
	}
	if fmt.Sprint(before.counts) != fmt.Sprint(after.counts) {
		t.Errorf("Counts changed with the upgrade:\nbefore %+v\nafter  %+v", before.counts, after.counts)
	}

	ixBefore := oaIndexes(t, pool, schema)
	if err := Migrate(ctx, pool, Config{Schema: schema}); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if v := oaVersions(t, pool, schema); !slices.Equal(v, []int32{1, 2, 3, 4, 5, 6}) {
		t.Errorf("versions %v after Migrate again", v)
	}
	if ixAfter := oaIndexes(t, pool, schema); fmt.Sprint(ixAfter) != fmt.Sprint(ixBefore) {
		t.Errorf("Migrate again changed the indexes:\n%v\n%v", ixBefore, ixAfter)
	}

	// A state no record can have is refused, not listed as nothing nor as
	// everything.
	for _, st := range []idemstore.State{"bogus", "COMPLETED", "Pending", "completed ", "needs-review"} {
		if page, err := s.List(ctx, idemstore.ListParams{State: st}); err == nil {
			t.Errorf("List of state %q: %d records and no error", st, len(page.Records))
		}
	}
}

// oaTraffic is traffic on a store during an upgrade: rounds run one after
// another in a goroutine until end, or until one fails.
type oaTraffic struct {
	stop  chan struct{}
	round chan struct{} // hears of the rounds that end while someone waits on it; closed when the traffic ends
	wg    sync.WaitGroup
	n     int // rounds completed
	err   error
}

// oaRunTraffic starts running round(0), round(1), ...
func oaRunTraffic(round func(i int) error) *oaTraffic {
	tr := &oaTraffic{stop: make(chan struct{}), round: make(chan struct{})}
	tr.wg.Go(func() {
		defer close(tr.round)
		for i := 0; ; i++ {
			select {
			case <-tr.stop:
				return
			default:
			}
			if err := round(i); err != nil {
				tr.err = err
				return
			}
			tr.n++
			select {
			case tr.round <- struct{}{}:
			default:
			}
		}
	})
	return tr
}

// wait waits for n rounds to end, or for the traffic to end.
func (tr *oaTraffic) wait(n int) {
	for range n {
		if _, ok := <-tr.round; !ok {
			return
		}
	}
}

// end stops the traffic, and returns the rounds it completed and the
// error it stopped on.
func (tr *oaTraffic) end() (rounds int, err error) {
	close(tr.stop)
	tr.wg.Wait()
	return tr.n, tr.err
}

// TestOpenKeyAttackConcurrentUpgrade runs three Migrate calls at once on a
// populated schema at version 4, while a store reserves and settles keys on
// it through statements prepared before the upgrade.
func TestOpenKeyAttackConcurrentUpgrade(t *testing.T) {
	pool := oaPool(t, 12)
	ctx := context.Background()
	schema := oaSchemaAt(t, pool, 4)
	recs := oaFill(t, pool, schema)
	s, err := New(pool, Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr := oaRunTraffic(func(i int) error {
		k := idemstore.Key{Scope: "traffic", Operation: "op1", Key: fmt.Sprintf("t-%d", i)}
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute}); err != nil {
			return fmt.Errorf("Reserve %v: %w", k, err)
		}
		if i%3 == 0 {
			if err := s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok", Reason: "x"}); err != nil {
				return fmt.Errorf("Escalate %v: %w", k, err)
			}
		} else if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
			return fmt.Errorf("Complete %v: %w", k, err)
		}
		if _, err := s.List(ctx, idemstore.ListParams{State: idemstore.StateNeedsReview, Limit: 5}); err != nil {
			return fmt.Errorf("List: %w", err)
		}
		return nil
	})
	tr.wait(5) // the traffic runs on statements prepared before the upgrade
	errs := make([]error, 3)
	var mg sync.WaitGroup
	for i := range errs {
		mg.Go(func() { errs[i] = Migrate(ctx, pool, Config{Schema: schema}) })
	}
	mg.Wait()
	tr.wait(5) // and goes on after it
	ops, trafErr := tr.end()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migrator %d: %v", i, err)
		}
	}
	if trafErr != nil {
		t.Errorf("traffic during the upgrade (after %d rounds): %v", ops, trafErr)
	}
	if v := oaVersions(t, pool, schema); !slices.Equal(v, []int32{1, 2, 3, 4, 5, 6}) {
		t.Errorf("versions %v after concurrent upgrades", v)
	}
	oaCheckOpenIndex(t, pool, schema)
	// The records written before are all there, listed right.
	var old []string
	for _, r := range oaListAll(t, s, idemstore.ListParams{State: idemstore.StateNeedsReview, Limit: 50}) {
		if !strings.Contains(r, "traffic") {
			old = append(old, r)
		}
	}
	if want := oaExpect(recs, idemstore.ListParams{State: idemstore.StateNeedsReview}); !slices.Equal(old, want) {
		t.Errorf("needs_review records after the upgrade:\n got %q\nwant %q", old, want)
	}
	t.Logf("%d rounds of traffic during the upgrade", ops)
}

// TestOpenKeyAttackPrecreatedConcurrently builds idem_records_open_key with
// CREATE INDEX CONCURRENTLY before upgrading, as the migration asks for on
// a large table: the migration must succeed, keep it and drop the old one.
func TestOpenKeyAttackPrecreatedConcurrently(t *testing.T) {
	pool := oaPool(t, 4)
	ctx := context.Background()
	schema := oaSchemaAt(t, pool, 4)
	recs := oaFill(t, pool, schema)
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE INDEX CONCURRENTLY idem_records_open_key ON "+table+" (state, scope, operation, key) WHERE state <> 'completed'"); err != nil {
		t.Fatal(err)
	}
	var oid uint32
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::oid", pgx.Identifier{schema, "idem_records_open_key"}.Sanitize()).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, pool, Config{Schema: schema}); err != nil {
		t.Fatalf("Migrate with the index built beforehand: %v", err)
	}
	oaCheckOpenIndex(t, pool, schema)
	var after uint32
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::oid", pgx.Identifier{schema, "idem_records_open_key"}.Sanitize()).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != oid {
		t.Errorf("the migration rebuilt the index built beforehand (oid %d, now %d)", oid, after)
	}
	s, err := New(pool, Config{Schema: schema, DisableBatch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := idemstore.ListParams{State: idemstore.StateNeedsReview, Limit: 7}
	if got, want := oaListAll(t, s, p), oaExpect(recs, p); !slices.Equal(got, want) {
		t.Errorf("needs_review:\n got %q\nwant %q", got, want)
	}
}

// TestOpenKeyAttackInvalidPrecreatedIndex: a CREATE INDEX CONCURRENTLY
// that fails (here on a lock timeout while a writer's transaction is open;
// a cancel or a lost connection does the same) leaves an INVALID index
// under the name. The migration's IF NOT EXISTS then skips building it and
// drops the index of states: the schema is left with no usable index of
// open records, and nothing says so. Migration 005 must either leave a
// valid index of open records or fail.
func TestOpenKeyAttackInvalidPrecreatedIndex(t *testing.T) {
	pool := oaPool(t, 4)
	ctx := context.Background()
	schema := oaSchemaAt(t, pool, 4)
	oaFill(t, pool, schema)
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	failedConcurrentIndex(t, pool, table, "CREATE INDEX CONCURRENTLY idem_records_open_key ON "+table+" (state, scope, operation, key) WHERE state <> 'completed'")
	if ix := oaIndexes(t, pool, schema)["idem_records_open_key"]; ix.valid {
		t.Skip("the failed CREATE INDEX CONCURRENTLY left a valid index")
	}

	if err := Migrate(ctx, pool, Config{Schema: schema}); err != nil {
		// Failing loudly is an acceptable answer: the operator learns of
		// the invalid index and rebuilds it.
		t.Logf("Migrate refuses: %v", err)
		if _, ok := oaIndexes(t, pool, schema)["idem_records_state_key"]; !ok {
			t.Errorf("Migrate failed but the index of states is gone")
		}
		return
	}
	oaCheckOpenIndex(t, pool, schema)
}

// TestOpenKeyAttackCeilingScript runs the schema set-up of
// idempg/bench/ceiling.sh against today's migrations: its "hot" schema
// drops "the three indexes that name state, expires_at or lease_until" by
// name, idem_records_state_key among them, which migration 005 has
// already dropped, under ON_ERROR_STOP: the script stops there.
func TestOpenKeyAttackCeilingScript(t *testing.T) {
	pool := oaPool(t, 4)
	ctx := context.Background()
	b, err := os.ReadFile("bench/ceiling.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	_, rest, ok := strings.Cut(script, "<<'SQL'\n")
	if !ok {
		t.Fatal("no <<'SQL' here-document in bench/ceiling.sh")
	}
	sql, _, ok := strings.Cut(rest, "\nSQL\n")
	if !ok {
		t.Fatal("the here-document of bench/ceiling.sh does not end")
	}
	// The script's schemas: ceil_hot and ceil_idem get every migration,
	// ceil_min none. Ours get unique names.
	hot := oaSchemaAt(t, pool, 1<<30)
	minimal := oaSchemaAt(t, pool, 0)
	sql = strings.NewReplacer("ceil_hot.", pgx.Identifier{hot}.Sanitize()+".", "ceil_min.", pgx.Identifier{minimal}.Sanitize()+".").Replace(sql)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sql); err != nil {
		t.Fatalf("bench/ceiling.sh's schema set-up fails on today's migrations (psql -v ON_ERROR_STOP=1 stops the script): %v", err)
	}
	// What the hot schema means: no index left that a settle writes.
	rows, _ := tx.Query(ctx, `SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass($1) AND pg_get_indexdef(i.indexrelid) ~ '(state|expires_at|lease_until)'`, pgx.Identifier{hot, "idem_records"}.Sanitize())
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("the hot schema keeps indexes that name state, expires_at or lease_until: %v", left)
	}
}

// oaLiteral renders a for EXECUTE, which takes literals.
func oaLiteral(t *testing.T, a any) string {
	t.Helper()
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	switch a := a.(type) {
	case string:
		return quote(a)
	case int:
		return fmt.Sprint(a)
	case time.Time:
		return quote(a.UTC().Format(time.RFC3339Nano)) + "::timestamptz"
	case time.Duration:
		return quote(fmt.Sprintf("%d microseconds", a.Microseconds())) + "::interval"
	case []string:
		q := make([]string, len(a))
		for i, s := range a {
			q[i] = quote(s)
		}
		return "ARRAY[" + strings.Join(q, ", ") + "]::text[]"
	}
	t.Fatalf("argument of type %T", a)
	return ""
}

func oaExecute(t *testing.T, name string, args []any) string {
	t.Helper()
	if len(args) == 0 {
		return "EXECUTE " + name
	}
	l := make([]string, len(args))
	for i, a := range args {
		l[i] = oaLiteral(t, a)
	}
	return "EXECUTE " + name + "(" + strings.Join(l, ", ") + ")"
}

const oaExplain = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) "

// oaGenericPlan returns the plan, run, of sql prepared and planned
// generically (plan_cache_mode = force_generic_plan), in a transaction
// rolled back, with settings ("name = value") set in it too.
func oaGenericPlan(t *testing.T, pool *pgxpool.Pool, sql string, args []any, settings ...string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, set := range append([]string{"plan_cache_mode = force_generic_plan"}, settings...) {
		if _, err := tx.Exec(ctx, "SET LOCAL "+set); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, "PREPARE oa_q AS "+sql); err != nil {
		t.Fatal(err)
	}
	rows, _ := tx.Query(ctx, oaExplain+oaExecute(t, "oa_q", args))
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// PREPARE is not undone by the rollback.
	if _, err := tx.Exec(ctx, "DEALLOCATE oa_q"); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// oaCachedPlan returns the plan, run, that conn's own prepared statement
// of sql (prepared by pgx when the store ran it) uses with the default
// plan_cache_mode, and how many generic and custom plans it has made.
func oaCachedPlan(t *testing.T, conn *pgxpool.Conn, sql string, args []any) (plan string, generic, custom int64) {
	t.Helper()
	ctx := context.Background()
	var name string
	if err := conn.QueryRow(ctx, "SELECT name FROM pg_prepared_statements WHERE statement = $1", sql).Scan(&name); err != nil {
		t.Fatalf("the store's statement is not prepared on its connection: %v\n%s", err, sql)
	}
	rows, _ := conn.Query(ctx, oaExplain+oaExecute(t, pgx.Identifier{name}.Sanitize(), args), pgx.QueryExecModeSimpleProtocol)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1", name).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n"), generic, custom
}

var (
	oaSeqScan  = regexp.MustCompile(`Seq Scan on idem_records\b`)
	oaExecTime = regexp.MustCompile(`Execution Time: ([0-9.]+ ms)`)
)

// oaLoad loads n records into schema: one in 100 in review, one in 500
// pending (a tenth of those past their lease), the rest completed (one in
// 1000 expired); 500 scopes; eight in ten of operation POST /payments,
// the rest across 50 others; created over the last n*0.4 seconds.
func oaLoad(t *testing.T, pool *pgxpool.Pool, schema string, n int) {
	t.Helper()
	ctx := context.Background()
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	start := time.Now()
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, operation, key, fingerprint, state, token, lease_until, response, reason,
    created_at, updated_at, expires_at)
SELECT 'tenant-' || lpad((i % 500)::text, 5, '0'),
    CASE WHEN (i / 100) % 10 < 8 THEN 'POST /payments' ELSE 'op-' || ((i / 100) % 50) END,
    'key-' || i, 'fp', x.s, 'tok-' || i,
    CASE WHEN x.s = 'pending' AND i % 5000 = 7 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,
    CASE WHEN x.s = 'completed' THEN $2::bytea END,
    CASE WHEN x.s = 'needs_review' THEN 'upstream timeout' ELSE '' END,
    now() - ($1 - i) * interval '400 milliseconds', now(),
    CASE WHEN x.s = 'completed' THEN now() + CASE WHEN i % 1000 = 1 THEN interval '-1 hour' ELSE interval '1 day' END END
FROM generate_series(1, $1) i,
LATERAL (SELECT CASE WHEN i % 100 = 0 THEN 'needs_review' WHEN i % 500 = 7 THEN 'pending' ELSE 'completed' END AS s) x`,
		n, idemstore.EncodeResponse(&idemstore.Response{Status: 201}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d records in %v", n, time.Since(start).Round(time.Millisecond))
}

// oaPlanCase is one statement whose plan the plan test checks.
type oaPlanCase struct {
	name string
	list *idemstore.ListParams // else sql and args
	cur  *idemstore.ListCursor
	sql  string
	args []any
	// want: an index the plan must read; noSeq: no sequential scan of
	// idem_records.
	want  string
	noSeq bool
}

// TestOpenKeyAttackPlans checks the plans of the listings and counts that
// migration 005 changed, on a table of oaSmallRecords records (or
// oaLargeRecords with IDEM_ATTACK_LARGE=1), as prepared statements: planned
// generically (force_generic_plan), and as the store's own prepared
// statements after it ran each eight times with the default
// plan_cache_mode. Open states must be read through the index of open
// records, never by a sequential scan of the table; completed records in
// key order through the primary key; expired leases and Purge through
// their own partial indexes. Times are logged, not checked.
func TestOpenKeyAttackPlans(t *testing.T) {
	n := oaSmallRecords
	if os.Getenv("IDEM_ATTACK_LARGE") == "1" {
		n = oaLargeRecords
	}
	// One connection: the store's statements are prepared on the one the
	// test then explains them on.
	pool := oaPool(t, 1)
	ctx := context.Background()
	schema := oaSchemaAt(t, pool, 1<<30)
	oaLoad(t, pool, schema, n)
	s, err := New(pool, Config{Schema: schema, DisableBatch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// Cursors from the middle of the open records.
	var mid oaRec
	if err := pool.QueryRow(ctx, `SELECT scope, operation, key, created_at FROM `+pgx.Identifier{schema, "idem_records"}.Sanitize()+`
WHERE state = 'needs_review' ORDER BY created_at, scope, operation, key OFFSET $1 LIMIT 1`, n/200).Scan(&mid.scope, &mid.op, &mid.key, &mid.created); err != nil {
		t.Fatal(err)
	}
	midCur := &idemstore.ListCursor{Key: mid.k(), CreatedAt: mid.created.UTC()}
	keyCur := &idemstore.ListCursor{Key: idemstore.Key{Scope: "tenant-00250", Operation: "POST /payments", Key: "key-0"}}

	nr, pe, co := idemstore.StateNeedsReview, idemstore.StatePending, idemstore.StateCompleted
	lp := func(st idemstore.State, o idemstore.Order, op string) *idemstore.ListParams {
		p := idemstore.ListParams{State: st, Order: o, Operation: op, Limit: 50}.Normalize()
		return &p
	}
	lpf := func(st idemstore.State, o idemstore.Order, f idemstore.ListParams) *idemstore.ListParams {
		f.State, f.Order, f.Limit = st, o, 50
		f = f.Normalize()
		return &f
	}
	open := "idem_records_open_key"
	cases := []oaPlanCase{
		{name: "needs_review by key", list: lp(nr, idemstore.OrderKey, ""), want: open, noSeq: true},
		{name: "needs_review by key, cursor", list: lp(nr, idemstore.OrderKey, ""), cur: keyCur, want: open, noSeq: true},
		{name: "needs_review oldest first", list: lp(nr, idemstore.OrderOldest, ""), want: open, noSeq: true},
		{name: "needs_review oldest first, cursor", list: lp(nr, idemstore.OrderOldest, ""), cur: midCur, want: open, noSeq: true},
		{name: "needs_review newest first", list: lp(nr, idemstore.OrderNewest, ""), want: open, noSeq: true},
		{name: "needs_review newest first, cursor", list: lp(nr, idemstore.OrderNewest, ""), cur: midCur, want: open, noSeq: true},
		{name: "needs_review of POST /payments by key", list: lp(nr, idemstore.OrderKey, "POST /payments"), want: open, noSeq: true},
		{name: "needs_review of op-3 by key", list: lp(nr, idemstore.OrderKey, "op-3"), noSeq: true},
		{name: "needs_review of POST /payments oldest first", list: lp(nr, idemstore.OrderOldest, "POST /payments"), want: open, noSeq: true},
		{name: "needs_review older than a minute, oldest first", list: lpf(nr, idemstore.OrderOldest, idemstore.ListParams{OlderThan: time.Minute}), want: open, noSeq: true},
		{name: "needs_review with a reason, by key", list: lpf(nr, idemstore.OrderKey, idemstore.ListParams{Reason: "TIMEOUT"}), want: open, noSeq: true},
		{name: "needs_review with a reason, oldest first", list: lpf(nr, idemstore.OrderOldest, idemstore.ListParams{Reason: "timeout"}), want: open, noSeq: true},
		{name: "needs_review of a key prefix", list: lpf(nr, idemstore.OrderKey, idemstore.ListParams{KeyPrefix: "key-1"}), noSeq: true},
		{name: "needs_review of a key prefix, oldest first", list: lpf(nr, idemstore.OrderOldest, idemstore.ListParams{KeyPrefix: "key-1"}), noSeq: true},
		{name: "pending by key", list: lp(pe, idemstore.OrderKey, ""), want: open, noSeq: true},
		{name: "pending oldest first", list: lp(pe, idemstore.OrderOldest, ""), want: open, noSeq: true},
		{name: "completed by key", list: lp(co, idemstore.OrderKey, ""), want: "idem_records_pkey"},
		{name: "completed by key, cursor", list: lp(co, idemstore.OrderKey, ""), cur: keyCur, want: "idem_records_pkey"},
		{name: "Counts of open records", sql: s.q.countOpen, want: open, noSeq: true},
		{name: "ListExpiredLeases", sql: s.q.expired, args: []any{100}, want: "idem_records_pending_lease", noSeq: true},
		{name: "Purge", sql: s.q.purge, args: []any{500}, want: "idem_records_completed_expiry", noSeq: true},
	}
	check := func(t *testing.T, c oaPlanCase, mode, plan string) {
		t.Helper()
		tm := ""
		if m := oaExecTime.FindStringSubmatch(plan); m != nil {
			tm = m[1]
		}
		t.Logf("%s, %s: %s", c.name, mode, tm)
		if os.Getenv("IDEM_ATTACK_PLANS") != "" {
			t.Logf("%s", plan)
		}
		if c.want != "" && !strings.Contains(plan, c.want) {
			t.Errorf("%s, %s plan does not read %s:\n%s", c.name, mode, c.want, plan)
		}
		if c.noSeq && oaSeqScan.MatchString(plan) {
			t.Errorf("%s, %s plan scans the whole table:\n%s", c.name, mode, plan)
		}
	}
	for i := range cases {
		c := &cases[i]
		if c.list != nil {
			c.sql, c.args = listQuery(s.q.list, *c.list, c.cur)
		}
		check(t, *c, "generic", oaGenericPlan(t, pool, c.sql, c.args))
	}

	// The store's own statements, default plan_cache_mode: List, Counts
	// and ListExpiredLeases through the store (Purge deletes: it runs
	// through pgx in a rolled-back transaction on the same connection).
	for _, c := range cases {
		for range 8 {
			switch {
			case c.list != nil && c.cur == nil:
				if _, err := s.List(ctx, *c.list); err != nil {
					t.Fatal(err)
				}
			case c.sql == s.q.countOpen:
				if _, err := s.Counts(ctx); err != nil {
					t.Fatal(err)
				}
			case c.sql == s.q.expired:
				if _, err := s.ListExpiredLeases(ctx, 100); err != nil {
					t.Fatal(err)
				}
			default:
				// Cursors (whose values the store would pass itself) and
				// Purge: the same statement through the pool, as pgx
				// prepares it, in a transaction rolled back.
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				rows, err := tx.Query(ctx, c.sql, c.args...)
				if err == nil {
					rows.Close()
					err = rows.Err()
				}
				_ = tx.Rollback(ctx)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
			}
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, c := range cases {
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		plan, g, cu := oaCachedPlan(t, conn, c.sql, c.args)
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		check(t, c, fmt.Sprintf("pgx-prepared (generic %d, custom %d)", g, cu), plan)
	}
}
