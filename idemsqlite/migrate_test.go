package idemsqlite_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

func TestMigrateIsIdempotentAndVersioned(t *testing.T) {
	t.Parallel()
	db := openDB(t, idemsqlite.OpenOptions{})
	ctx := context.Background()
	for range 2 {
		if err := idemsqlite.Migrate(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	var n, version int
	if err := db.QueryRow("SELECT count(*), max(version) FROM idem_schema_migrations").Scan(&n, &version); err != nil {
		t.Fatal(err)
	}
	if n != 5 || version != 5 {
		t.Fatalf("idem_schema_migrations has %d rows, max version %d; want 5 rows, version 5", n, version)
	}
	var indexes string
	if err := db.QueryRow(`SELECT group_concat(name, ' ') FROM (SELECT name FROM sqlite_schema
		WHERE type = 'index' AND tbl_name = 'idem_records' AND name LIKE 'idem_records_%' ORDER BY name)`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if want := "idem_records_completed_expiry idem_records_created idem_records_key_value idem_records_label idem_records_open_created idem_records_pending_lease"; indexes != want {
		t.Fatalf("idem_records has the named indexes %q, want %q", indexes, want)
	}
}

// TestQueryPlans: the statements that find records by state run on the
// partial index made for them, without a sort, and a listing of completed
// records in key order runs on the primary key without one.
func TestQueryPlans(t *testing.T) {
	t.Parallel()
	_, db := newStore(t)
	after := &idemstore.ListCursor{Key: idemstore.Key{Scope: "s", Operation: "POST /x", Key: "k"}, CreatedAt: time.Now()}
	for _, tc := range []struct {
		name  string
		query string
		args  []any
		index string // the index the plan must use
		sorts bool   // whether the plan may sort (what it finds on the index)
	}{
		{"expired leases", idemsqlite.ExpiredLeasesQuery, []any{0, 10}, "idem_records_pending_lease", false},
		{"purge", idemsqlite.PurgeQuery, []any{0, 10}, "idem_records_completed_expiry", false},
		{"list needs_review", "", nil, "idem_records_open_created", true},
		// SQLite sorts the last term of the order here, although the
		// index gives it; the rows it sorts are pending ones of one
		// operation only.
		{"list pending of an operation after a key", "", nil, "idem_records_open_created", true},
		{"list completed", "", nil, "sqlite_autoindex_idem_records_1", false},
		{"list all after a key", "", nil, "sqlite_autoindex_idem_records_1", false},
		// Searches: on the indexes made for them.
		{"search a key after a key", "", nil, "idem_records_key_value", false},
		{"search a key prefix", "", nil, "idem_records_key_value", false},
		{"search a key in review, oldest first", "", nil, "idem_records_open_created", false},
		{"search labels", "", nil, "idem_records_label", true},
		{"list all oldest first after a record", "", nil, "idem_records_created", true},
		{"list all newest first", "", nil, "idem_records_created", true},
		// The review queue by age: its few records, sorted, never a walk
		// of every record by age.
		{"list needs_review oldest first", "", nil, "idem_records_open_created", false},
	} {
		switch tc.name {
		case "list needs_review":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{State: idemstore.StateNeedsReview}, nil)
		case "list pending of an operation after a key":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{State: idemstore.StatePending, Operation: "POST /x"}, after)
		case "list completed":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{State: idemstore.StateCompleted}, nil)
		case "list all after a key":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{}, after)
		case "search a key after a key":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{Key: "k"}, after)
		case "search a key prefix":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{KeyPrefix: "order-1", State: idemstore.StateCompleted}, nil)
		case "search a key in review, oldest first":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{Key: "k", State: idemstore.StateNeedsReview, Order: idemstore.OrderOldest}, nil)
		case "search labels":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{ScopeLabels: []string{"a", "b"}}, nil)
		case "list all oldest first after a record":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{Order: idemstore.OrderOldest}, after)
		case "list needs_review oldest first":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{State: idemstore.StateNeedsReview, Order: idemstore.OrderOldest, Limit: 50}, after)
		case "list all newest first":
			tc.query, tc.args = idemsqlite.ListQuery(idemstore.ListParams{Order: idemstore.OrderNewest, Reason: "timeout"}, nil)
		}
		rows, err := db.Query("EXPLAIN QUERY PLAN "+tc.query, tc.args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			t.Fatal(err)
		}
		all := strings.Join(plan, "; ")
		if !strings.Contains(all, "INDEX "+tc.index) || (!tc.sorts && strings.Contains(all, "TEMP B-TREE")) {
			t.Errorf("%s: plan %q; want it on %s, without a sort", tc.name, all, tc.index)
		}
	}
}

// A record written under the first schema reads back after the second
// migration: UpdatedAt from CreatedAt, no request.
func TestMigrateKeepsRecordsOfTheFirstSchema(t *testing.T) {
	t.Parallel()
	db := openDB(t, idemsqlite.OpenOptions{})
	ctx := context.Background()
	first, err := os.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		string(first),
		`CREATE TABLE idem_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`,
		`INSERT INTO idem_schema_migrations VALUES (1, '0001_init.sql', 0)`,
		`INSERT INTO idem_records (scope, operation, "key", fingerprint, state, token, lease_until, created_at)
			VALUES ('s', 'POST /x', 'k', 'fp', 'pending', 'tok', 1764547200000, 1764547100000)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	s, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, idemstore.Key{Scope: "s", Operation: "POST /x", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if !rec.UpdatedAt.Equal(rec.CreatedAt) || rec.CreatedAt.UnixMilli() != 1764547100000 || rec.Request != nil || rec.Token != "tok" {
		t.Fatalf("a first-schema record after migration: %+v", rec)
	}
}

func TestNewSkipMigrate(t *testing.T) {
	t.Parallel()
	db := openDB(t, idemsqlite.OpenOptions{})
	if _, err := idemsqlite.New(db, idemsqlite.Config{SkipMigrate: true}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name IN ('idem_records', 'idem_schema_migrations')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("SkipMigrate: %d idem tables exist, want none", n)
	}
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	db := openDB(t, idemsqlite.OpenOptions{})
	ctx := context.Background()
	if err := idemsqlite.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO idem_schema_migrations (version, name, applied_at) VALUES (9999, '9999_future.sql', 0)`); err != nil {
		t.Fatal(err)
	}
	if err := idemsqlite.Migrate(ctx, db); err == nil {
		t.Fatal("Migrate accepted a database with an unknown, newer schema version")
	}
	if _, err := idemsqlite.New(db, idemsqlite.Config{}); err == nil {
		t.Fatal("New accepted a database with an unknown, newer schema version")
	}
}
