package storeurl

import (
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemsqlite"
)

// The accessors below hand the parsed connection settings to tools that
// open their own handle on the database a URL names rather than a store
// (idem lab opens a pool and works on a scratch table). Each returns a
// copy, so the Target stays usable, and the zero value for another kind.

// PostgresConfig returns the pgx pool configuration and the schema (the
// schema parameter, "" when absent) of a postgres:// URL, or nil and "".
func (t *Target) PostgresConfig() (*pgxpool.Config, string) {
	if t.Kind != KindPostgres || t.pg == nil {
		return nil, ""
	}
	return t.pg.Copy(), t.pgSchema
}

// MySQLConfig returns the go-sql-driver configuration of a mysql:// URL,
// or nil.
func (t *Target) MySQLConfig() *mysql.Config {
	if t.Kind != KindMySQL || t.my == nil {
		return nil
	}
	return t.my.Clone()
}

// SQLite returns the file path and the open options of a sqlite:// URL, or
// "" and the zero options.
func (t *Target) SQLite() (string, idemsqlite.OpenOptions) {
	if t.Kind != KindSQLite {
		return "", idemsqlite.OpenOptions{}
	}
	return t.sqlitePath, t.sqliteOpts
}
