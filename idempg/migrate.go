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
