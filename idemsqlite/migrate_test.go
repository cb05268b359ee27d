package idemsqlite_test

import (
	"context"
	"testing"

	"github.com/idem-dev/idem/idemsqlite"
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
	if n != 1 || version != 1 {
		t.Fatalf("idem_schema_migrations has %d rows, max version %d; want 1 row, version 1", n, version)
	}
	var indexes int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'idem_records' AND name LIKE 'idem_records_%'`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 3 {
		t.Fatalf("idem_records has %d named indexes, want 3", indexes)
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
