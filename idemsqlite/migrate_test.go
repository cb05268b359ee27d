package idemsqlite_test

import (
	"context"
	"os"
	"testing"

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
	if n != 2 || version != 2 {
		t.Fatalf("idem_schema_migrations has %d rows, max version %d; want 2 rows, version 2", n, version)
	}
	var indexes int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'idem_records' AND name LIKE 'idem_records_%'`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 3 {
		t.Fatalf("idem_records has %d named indexes, want 3", indexes)
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
