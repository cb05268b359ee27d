package idempg

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/searchbench"
)

// TestSearchAtScale times the admin searches on a million records, ten
// thousand in review, in a schema of its own (see package searchbench).
func TestSearchAtScale(t *testing.T) {
	runs := searchbench.Enabled(t)
	ctx := context.Background()
	pool := oaPool(t, 4)
	schema := migratedSchema(t, pool)
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	start := time.Now()
	resp := idemstore.EncodeResponse(&idemstore.Response{Status: 201, Body: []byte(strings.Repeat("x", 120))})
	req := idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/payments"})
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, operation, key, fingerprint, state, token, lease_until, response, reason,
    created_at, updated_at, expires_at, request, scope_label, label_index)
SELECT 'tenant-' || lpad((i % $1)::text, 41, '0'), 'POST /payments', 'order-' || (i % $2), 'v2:fp', s, 'tok-' || i,
    c, CASE WHEN s = 'completed' THEN $3::bytea END,
    CASE WHEN s = 'needs_review' THEN 'upstream timeout after the request was sent' ELSE '' END,
    c, c, CASE WHEN s = 'completed' THEN now() + interval '1 day' END, $4::bytea, 'acct_' || (i % $5), 'acct_' || (i % $5)
FROM generate_series(1, $6) i,
    LATERAL (SELECT CASE WHEN i % $7 = 0 THEN 'needs_review' ELSE 'completed' END AS s,
        now() - ($6 - i) * interval '86 milliseconds' AS c) x`,
		searchbench.Scopes, searchbench.KeyModulo, resp, req, searchbench.Labels, searchbench.Records, searchbench.ReviewEvery)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("postgres: loaded %d records in %v\n", searchbench.Records, time.Since(start).Round(time.Second))
	s, err := New(pool, Config{Schema: schema, DisableBatch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	searchbench.Measure(t, "postgres", s, runs)
	for _, q := range []struct {
		name, sql string
		args      []any
	}{{"counts of open records", s.q.countOpen, nil}, {"count of completed records", s.q.countCompleted, []any{idemstore.ExactCountLimit + 1, table}}} {
		rows, _ := pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, SUMMARY OFF) "+q.sql, q.args...)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("--- postgres plan: %s\n%s\n", q.name, strings.Join(lines, "\n"))
	}
	searchbench.Plans(t, "postgres", func(p idemstore.ListParams) (string, error) {
		sql, args := listQuery(s.q.list, p, nil)
		rows, _ := pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, SUMMARY OFF) "+sql, args...)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		return strings.Join(lines, "\n"), err
	})
}
