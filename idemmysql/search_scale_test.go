package idemmysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/searchbench"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestSearchAtScale times the admin searches on a million records, ten
// thousand in review, in a database of its own (see package
// searchbench). It loads them with MariaDB's sequence engine
// (seq_1_to_N).
func TestSearchAtScale(t *testing.T) {
	runs := searchbench.Enabled(t)
	ctx := context.Background()
	base, err := mysql.ParseDSN(testenv.Getenv(t, "IDEM_TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", base.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	name := fmt.Sprintf("idem_bench_%d", time.Now().UnixNano())
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE "+name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	}()
	cfg := base.Clone()
	cfg.DBName = name
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := Migrate(ctx, db, Config{}); err != nil {
		t.Fatal(err)
	}
	s, err := New(db, Config{DisableBatch: true})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp := idemstore.EncodeResponse(&idemstore.Response{Status: 201, Body: []byte(strings.Repeat("x", 120))})
	req := idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/payments"})
	now := time.Now().UnixMilli()
	_, err = db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO idem_records (scope, operation, `+"`key`"+`, fingerprint, state, token, lease_until, response, reason,
    created_at, updated_at, expires_at, request, scope_label, label_index)
SELECT CONCAT('tenant-', LPAD(seq %% ?, 41, '0')), 'POST /payments', CONCAT('order-', seq %% ?), 'v2:fp', st, CONCAT('tok-', seq), c,
    IF(st = 'completed', ?, NULL), IF(st = 'needs_review', 'upstream timeout after the request was sent', ''),
    c, c, IF(st = 'completed', ? + 86400000, NULL), ?, CONCAT('acct_', seq %% ?), CONCAT('acct_', seq %% ?)
FROM (SELECT seq, IF(seq %% ? = 0, 'needs_review', 'completed') AS st, ? - (%d - seq) * 86 AS c FROM seq_1_to_%d) g`,
		searchbench.Records, searchbench.Records),
		searchbench.Scopes, searchbench.KeyModulo, resp, now, req, searchbench.Labels, searchbench.Labels, searchbench.ReviewEvery, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "ANALYZE TABLE idem_records"); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("mysql: loaded %d records in %v\n", searchbench.Records, time.Since(start).Round(time.Second))
	searchbench.Measure(t, "mysql", s, runs)
	searchbench.Plans(t, "mysql", func(p idemstore.ListParams) (string, error) {
		q, args := listQuery(p, nil)
		rows, err := db.QueryContext(ctx, "EXPLAIN "+q, args...)
		if err != nil {
			return "", err
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		var out []string
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				return "", err
			}
			var parts []string
			for i, c := range cols {
				if vals[i].Valid && (c == "table" || c == "type" || c == "key" || c == "rows" || c == "Extra") {
					parts = append(parts, c+"="+vals[i].String)
				}
			}
			out = append(out, strings.Join(parts, " "))
		}
		return strings.Join(out, "\n"), rows.Err()
	})
}
