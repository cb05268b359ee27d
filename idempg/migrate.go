package idempg

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"regexp"
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
//
// Stores of this version run against a schema at migration 005 too, and
// stores of the previous version against one at 006: migration 006 only
// adds a function (idem_awaited), which a store uses once it has seen the
// migration recorded (see Config.Migrate).
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
		var builds []string // the indexes that pending migrations build
		for _, m := range ms {
			if !done[m.Version] {
				for _, sub := range builtIndex.FindAllStringSubmatch(m.SQL, -1) {
					builds = append(builds, sub[1])
				}
			}
		}
		if err := dropInvalidIndexes(ctx, tx, cfg.Schema, builds); err != nil {
			return err
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
		return checkBuiltIndexes(ctx, tx, cfg.Schema, builds)
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

// builtIndex finds the indexes a migration builds if they are missing.
var builtIndex = regexp.MustCompile(`(?i)CREATE\s+INDEX\s+IF\s+NOT\s+EXISTS\s+(\w+)`)

// dropInvalidIndexes drops, among names (the indexes that pending
// migrations build with CREATE INDEX IF NOT EXISTS), those that exist in
// schema but are invalid. A CREATE INDEX CONCURRENTLY that failed
// (cancelled, a lock timeout, a lost connection), run by an operator ahead
// of an upgrade as the migrations suggest, leaves an invalid index under
// its name, which PostgreSQL keeps up to date but never reads: the
// migration would take it for the index it builds, and one that drops an
// index it replaces would leave none that works. Dropped, the index is
// built by the migration, in its transaction. Other indexes are left
// alone: no pending migration would build them again.
//
// An index being built concurrently right now is invalid too, until its
// build ends: the table is locked first, which waits for such a build. The
// lock is the one DROP INDEX takes (ACCESS EXCLUSIVE), so that it is never
// raised while a store's transaction waits behind it.
func dropInvalidIndexes(ctx context.Context, tx pgx.Tx, schema string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	const invalid = `SELECT t.relname, c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = ANY($2) AND NOT i.indisvalid ORDER BY t.relname, c.relname`
	type index struct{ table, name string }
	find := func() ([]index, error) {
		rows, _ := tx.Query(ctx, invalid, schema, names)
		return pgx.CollectRows(rows, func(row pgx.CollectableRow) (index, error) {
			var ix index
			err := row.Scan(&ix.table, &ix.name)
			return ix, err
		})
	}
	found, err := find()
	if err != nil || len(found) == 0 {
		return err
	}
	locked := map[string]bool{}
	for _, ix := range found {
		if !locked[ix.table] {
			locked[ix.table] = true
			if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, ix.table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				return err
			}
		}
	}
	// Again, now that no build is in progress: one may have ended valid.
	if found, err = find(); err != nil {
		return err
	}
	for _, ix := range found {
		if _, err := tx.Exec(ctx, "DROP INDEX "+pgx.Identifier{schema, ix.name}.Sanitize()); err != nil {
			return fmt.Errorf("drop invalid index %s: %w", ix.name, err)
		}
	}
	return nil
}

// checkBuiltIndexes fails the migration, rolled back, when an index that
// it was to build (names) is missing or invalid: an operator's CREATE
// INDEX CONCURRENTLY of the same name that started after
// dropInvalidIndexes looked and then failed leaves an invalid index, which
// CREATE INDEX IF NOT EXISTS takes for its own. Run again, Migrate drops it
// and builds the index.
func checkBuiltIndexes(ctx context.Context, tx pgx.Tx, schema string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	rows, _ := tx.Query(ctx, `SELECT n.name FROM unnest($2::text[]) n(name) WHERE NOT EXISTS (
    SELECT FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace s ON s.oid = c.relnamespace
    WHERE s.nspname = $1 AND c.relname = n.name AND i.indisvalid) ORDER BY n.name`, schema, names)
	bad, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		return fmt.Errorf("index %s is missing or invalid after the migrations (a concurrent build of it that failed?); nothing was changed: run migrate again", strings.Join(bad, ", "))
	}
	return nil
}
