package idemsqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate brings the schema in db up to date, applying every embedded
// migration not yet recorded in the idem_schema_migrations table. It is safe
// to call concurrently from several processes sharing one database file: the
// work runs in a BEGIN IMMEDIATE transaction, so migrators take turns and
// each migration is applied exactly once. A database that records a version
// this build does not know (written by a newer idem) is refused. New calls it
// unless Config.SkipMigrate is set.
func Migrate(ctx context.Context, db *sql.DB) (err error) {
	ms, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return interpretError(ctx, err)
	}
	defer conn.Close()

	// BEGIN IMMEDIATE whatever the DSN's _txlock says: a deferred transaction
	// that reads the version table and then writes could fail with
	// SQLITE_BUSY on the lock upgrade when another process migrates too.
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return interpretError(ctx, err)
	}
	defer func() {
		if err != nil {
			// A fresh context: the rollback must run even if ctx ended.
			_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		}
	}()
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL
	)`); err != nil {
		return interpretError(ctx, err)
	}
	applied := map[int]bool{}
	rows, err := conn.QueryContext(ctx, "SELECT version FROM idem_schema_migrations")
	if err != nil {
		return interpretError(ctx, err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return interpretError(ctx, err)
		}
		applied[v] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return interpretError(ctx, err)
	}
	known := map[int]bool{}
	for _, m := range ms {
		known[m.Version] = true
	}
	for v := range applied {
		if !known[v] {
			return errorf("database has schema version %d, unknown to this build: refusing to run against a newer schema", v)
		}
	}
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		if _, err := conn.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("idemsqlite: migration %s: %w", m.Name, interpretError(ctx, err))
		}
		if _, err := conn.ExecContext(ctx,
			"INSERT INTO idem_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
			m.Version, m.Name, time.Now().UnixMilli()); err != nil {
			return interpretError(ctx, err)
		}
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return interpretError(ctx, err)
	}
	return nil
}
