package idemmysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// splitStatements splits a migration file at lines ending in ";", dropping
// "--" comment lines. Migrations must not put ";" at a line end elsewhere.
func splitStatements(src string) []string {
	var (
		out []string
		cur strings.Builder
	)
	for _, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// Migrate applies the embedded migrations that the database's
// idem_schema_migrations table does not list yet. MySQL commits DDL
// statements implicitly, so the migrations are not transactional; instead a
// named lock (GET_LOCK, per database) serialises concurrent migrators, so
// several processes may call Migrate at start-up. It is what the
// idem migrate command runs.
func Migrate(ctx context.Context, db *sql.DB, cfg Config) (err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("idemmysql: migrate: %w", interpretError(ctx, err))
		}
	}()
	ms, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		return err
	}
	// GET_LOCK belongs to a session: take and release it on one connection.
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var got sql.NullInt64
	err = conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('idem_migrate:', DATABASE()), ?)",
		int(cfg.MigrateLockTimeout.Seconds())).Scan(&got)
	if err != nil {
		return err
	}
	if !got.Valid || got.Int64 != 1 {
		return errors.New("timed out waiting for another migrator (GET_LOCK)")
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(CONCAT('idem_migrate:', DATABASE()))")
	}()
	_, err = conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    version    INT NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE = InnoDB`)
	if err != nil {
		return err
	}
	done := map[int]bool{}
	rows, err := conn.QueryContext(ctx, "SELECT version FROM idem_schema_migrations")
	if err != nil {
		return err
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return err
		}
		done[v] = true
	}
	if err := rows.Close(); err != nil {
		return err
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		for _, stmt := range splitStatements(m.SQL) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO idem_schema_migrations (version, name) VALUES (?, ?)", m.Version, m.Name); err != nil {
			return err
		}
	}
	return nil
}
