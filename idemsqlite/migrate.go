package idemsqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migration is one embedded schema change, named NNNN_description.sql.
type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations reads the embedded migrations in version order.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		name := e.Name()
		prefix, _, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("idemsqlite: bad migration name %q", name)
		}
		v, err := strconv.Atoi(prefix)
		if err != nil {
			return nil, fmt.Errorf("idemsqlite: bad migration name %q: %w", name, err)
		}
		body, err := fs.ReadFile(migrationFS, "migrations/"+name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// Migrate brings the schema in db up to date, applying every embedded
// migration not yet recorded in the idem_schema_migrations table. It is safe
// to call concurrently from several processes sharing one database file: the
// work runs in a BEGIN IMMEDIATE transaction, so migrators take turns and
// each migration is applied exactly once. A database that records a version
// this build does not know (written by a newer idem) is refused. New calls it
// unless Config.SkipMigrate is set.
func Migrate(ctx context.Context, db *sql.DB) (err error) {
	ms, err := loadMigrations()
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
		known[m.version] = true
	}
	for v := range applied {
		if !known[v] {
			return errorf("database has schema version %d, unknown to this build: refusing to run against a newer schema", v)
		}
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		if _, err := conn.ExecContext(ctx, m.sql); err != nil {
			return fmt.Errorf("idemsqlite: migration %s: %w", m.name, interpretError(ctx, err))
		}
		if _, err := conn.ExecContext(ctx,
			"INSERT INTO idem_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
			m.version, m.name, time.Now().UnixMilli()); err != nil {
			return interpretError(ctx, err)
		}
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return interpretError(ctx, err)
	}
	return nil
}
