package idemsqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/searchbench"
)

// TestSearchAtScale times the admin searches on a million records, ten
// thousand in review, in a database file of its own (see package
// searchbench).
func TestSearchAtScale(t *testing.T) {
	runs := searchbench.Enabled(t)
	ctx := context.Background()
	db, err := Open(filepath.Join(t.TempDir(), "idem.db"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(db, Config{DisableBatch: true})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp := idemstore.EncodeResponse(&idemstore.Response{Status: 201, Body: []byte(strings.Repeat("x", 120))})
	req := idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/payments"})
	now := time.Now().UnixMilli()
	_, err = db.ExecContext(ctx, `WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?6),
r(i, st, c) AS (SELECT i, CASE WHEN i % ?7 = 0 THEN 'needs_review' ELSE 'completed' END, ?8 - (?6 - i) * 86 FROM g)
INSERT INTO idem_records (scope, operation, "key", fingerprint, state, token, lease_until, response, reason,
    created_at, updated_at, expires_at, request, scope_label, label_index)
SELECT 'tenant-' || printf('%041d', i % ?1), 'POST /payments', 'order-' || (i % ?2), 'v2:fp', st, 'tok-' || i, c,
    CASE WHEN st = 'completed' THEN ?3 END,
    CASE WHEN st = 'needs_review' THEN 'upstream timeout after the request was sent' ELSE '' END,
    c, c, CASE WHEN st = 'completed' THEN ?8 + 86400000 END, ?4, 'acct_' || (i % ?5), 'acct_' || (i % ?5)
FROM r`, searchbench.Scopes, searchbench.KeyModulo, resp, req, searchbench.Labels, searchbench.Records, searchbench.ReviewEvery, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("sqlite: loaded %d records in %v\n", searchbench.Records, time.Since(start).Round(time.Second))
	searchbench.Measure(t, "sqlite", s, runs)
	searchbench.Plans(t, "sqlite", func(p idemstore.ListParams) (string, error) {
		q, args := listQuery(p, nil, time.Now())
		rows, err := db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			return "", err
		}
		defer rows.Close()
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				return "", err
			}
			plan = append(plan, detail)
		}
		return strings.Join(plan, "\n"), rows.Err()
	})
}
