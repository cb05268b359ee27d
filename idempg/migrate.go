package idempg

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/idem-dev/idem/internal/migrations"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates cfg.Schema if needed and applies the embedded migrations
// that the schema's idem_schema_migrations table does not list yet, all in
// one transaction. A transaction-scoped advisory lock per schema serialises
// concurrent migrators, so several processes may call Migrate at start-up.
// It is what the idem migrate command runs.
func Migrate(ctx context.Context, pool *pgxpool.Pool, cfg Config) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	ms, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		return err
	}
	schema := pgx.Identifier{cfg.Schema}.Sanitize()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLockKey(cfg.Schema)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schema+`.idem_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`)
		if err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, `SELECT version FROM `+schema+`.idem_schema_migrations`)
		applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		done := make(map[int]bool, len(applied))
		for _, v := range applied {
			done[int(v)] = true
		}
		if len(done) < len(ms) {
			if err := dropInvalidIndexes(ctx, tx, cfg.Schema); err != nil {
				return err
			}
		}
		for _, m := range ms {
			if done[m.Version] {
				continue
			}
			// No arguments: the simple protocol runs the whole file.
			if _, err := tx.Exec(ctx, strings.ReplaceAll(m.SQL, "{schema}", schema)); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.idem_schema_migrations (version, name) VALUES ($1, $2)`,
				m.Version, m.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("idempg: migrate: %w", interpretError(ctx, err))
	}
	return nil
}

// migrationLockKey is the advisory lock key for migrating schema.
func migrationLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem migrate\x00" + schema))
	return int64(h.Sum64())
}

// dropInvalidIndexes drops the invalid indexes of idem's tables in schema
// that bear idem's names, before pending migrations run. A CREATE INDEX
// CONCURRENTLY that failed (cancelled, a lock timeout, a lost connection)
// leaves an invalid index under its name, which PostgreSQL keeps up to date
// but never reads; a migration's CREATE INDEX IF NOT EXISTS would take it
// for the index it builds, and a migration that drops an index it replaces
// would leave none that works. Dropped, the index is built by the
// migration, in its transaction.
//
// An index being built concurrently right now is invalid too, until its
// build ends: the tables are locked first in SHARE UPDATE EXCLUSIVE mode,
// which waits for such a build and does not hold writes.
func dropInvalidIndexes(ctx context.Context, tx pgx.Tx, schema string) error {
	rows, _ := tx.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname LIKE 'idem\_%' ORDER BY c.relname`, schema)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, t := range tables {
		if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, t}.Sanitize()+" IN SHARE UPDATE EXCLUSIVE MODE"); err != nil {
			return err
		}
	}
	rows, _ = tx.Query(ctx, `SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class t ON t.oid = i.indrelid
WHERE n.nspname = $1 AND NOT i.indisvalid AND c.relname LIKE 'idem\_%' AND t.relname LIKE 'idem\_%' ORDER BY c.relname`, schema)
	invalid, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, ix := range invalid {
		if _, err := tx.Exec(ctx, "DROP INDEX "+pgx.Identifier{schema, ix}.Sanitize()); err != nil {
			return fmt.Errorf("drop invalid index %s: %w", ix, err)
		}
	}
	return nil
}
