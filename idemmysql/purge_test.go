package idemmysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
)

// TestPurgeUsesTheExpiryIndex holds Purge to the index of expiry with a
// backlog of expired records: read by the index of states, every batch
// sorted all the completed records (a filesort) while it held their locks,
// 1.8 s for a batch of 500 with 50,000 expired records. The plan must
// read the expired records from idem_records_state_expiry in its order,
// and delete them by primary key.
func TestPurgeUsesTheExpiryIndex(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, "")
	ctx := context.Background()
	fill(t, db, "expired", 20_000, "completed", "0")
	if _, err := db.ExecContext(ctx, "ANALYZE TABLE idem_records"); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, "EXPLAIN "+idemmysql.PurgeSQL, 500)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	usesExpiry := false
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		line := make([]string, len(cols))
		for i, v := range vals {
			line[i] = cols[i] + "=" + v.String
			switch {
			case cols[i] == "key" && v.String == "idem_records_state_expiry":
				usesExpiry = true
			case cols[i] == "Extra" && strings.Contains(v.String, "filesort"):
				t.Errorf("the purge sorts: %s", v.String)
			}
		}
		plan = append(plan, strings.Join(line, " "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !usesExpiry {
		t.Errorf("the purge does not read idem_records_state_expiry:\n%s", strings.Join(plan, "\n"))
	}
}

// TestPurgeBacklog purges a backlog of expired records in batches and
// leaves every other record: the unexpired completed ones, the pending
// ones and those in review, whatever their expiry column says.
func TestPurgeBacklog(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, "")
	ctx := context.Background()
	fill(t, db, "expired", 3_000, "completed", "0")
	fill(t, db, "alive", 200, "completed", "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000) + 3600000")
	fill(t, db, "pending", 100, "pending", "0")
	fill(t, db, "review", 100, "needs_review", "0")
	var reported int
	n, err := s.Purge(ctx, idemstore.PurgeParams{BatchSize: 250, Progress: func(d int) { reported = d }})
	if err != nil {
		t.Fatal(err)
	}
	if n != 3_000 || reported != 3_000 {
		t.Errorf("Purge deleted %d, reported %d; want 3000", n, reported)
	}
	want := map[string]int{"completed": 200, "pending": 100, "needs_review": 100}
	for state, w := range want {
		var got int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_records WHERE state = ?", state).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != w {
			t.Errorf("%d %s records left; want %d", got, state, w)
		}
	}
}

// fill inserts n records in state whose expiry (in Unix milliseconds) is
// the SQL expression expires, under keys that start with name.
func fill(t *testing.T, db *sql.DB, name string, n int, state, expires string) {
	t.Helper()
	const chunk = 500
	for i := 0; i < n; i += chunk {
		var b strings.Builder
		b.WriteString("INSERT INTO idem_records (scope, operation, `key`, fingerprint, state, token, lease_until, response, reason, created_at, expires_at, updated_at) VALUES ")
		for j := i; j < min(n, i+chunk); j++ {
			if j > i {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "('scope-%d', 'POST /orders', '%s-%d', 'v2:f', '%s', 'tok-%d', 0, REPEAT('x', 100), '', %d, %s, %d)",
				j%50, name, j, state, j, 1000+j, expires, 1000+j)
		}
		if _, err := db.ExecContext(context.Background(), b.String()); err != nil {
			t.Fatal(err)
		}
	}
}
