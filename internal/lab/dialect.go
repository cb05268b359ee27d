package lab

import (
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/internal/storeurl"
)

// dialect is what differs between the databases: how to open them, the
// SQL of each step, and how to read their errors.
type dialect struct {
	name string // PostgreSQL, MySQL/MariaDB, SQLite

	// levels maps each isolation level the database runs to "", and each
	// one it does not to the reason it is skipped.
	skip func(Isolation) string

	// begin returns the statements that open a transaction.
	begin func(Isolation, Strategy) []string
	// beginLocks reports whether begin takes a lock that makes the other
	// workers wait before their check, so that a barrier after the check
	// could never fill (SQLite's BEGIN IMMEDIATE).
	beginLocks func(Strategy) bool
	// forUpdate is appended to the check of select-for-update ("" when the
	// database has no such clause).
	forUpdate string
	// session runs once on every connection.
	session []string

	createCheck  func(table string, unique bool) []string
	createInsert func(table string) []string
	check        func(table string) string // one parameter: the key
	insert       func(table string) string // two: the key, the worker
	insertFirst  func(table string) string // two: the key, the worker
	// loserOnDuplicate: insertFirst reports a loser by a duplicate-key
	// error, which the strategy handles, rather than by zero rows.
	loserOnDuplicate bool
	countLike        func(table string) string // one parameter: a LIKE pattern
	drop             func(table string) string
	version          string

	classify func(error) errClass

	// backendID returns the server's id of the session, and kill ends a
	// session by that id; both empty where ending a stuck session is not
	// needed (PostgreSQL cancels, SQLite is in-process).
	backendID string
	kill      func(id int64) string

	// qualify turns a table name into how SQL names it.
	qualify func(string) string

	// open returns a handle with room for conns connections.
	open    func(conns int) (*sql.DB, error)
	cleanup func() // removes what open created, after the handles are closed
}

// dialectFor returns the dialect of the database t names.
func dialectFor(t *storeurl.Target) (*dialect, error) {
	switch t.Kind {
	case storeurl.KindPostgres:
		cfg, schema := t.PostgresConfig()
		return postgresDialect(*cfg.ConnConfig, schema), nil
	case storeurl.KindMySQL:
		return mysqlDialect(t.MySQLConfig()), nil
	case storeurl.KindSQLite:
		path, opts := t.SQLite()
		return sqliteDialect(path, opts), nil
	}
	return nil, fmt.Errorf("lab: %s is a %s store; idem lab runs on SQL databases: postgres://…, mysql://… or sqlite://PATH", t.Redacted, t.Kind)
}

var sqlLevel = map[Isolation]string{
	ReadCommitted:  "READ COMMITTED",
	RepeatableRead: "REPEATABLE READ",
	Serializable:   "SERIALIZABLE",
}

func noSkip(Isolation) string { return "" }

func postgresDialect(cc pgx.ConnConfig, schema string) *dialect {
	q := func(table string) string {
		if schema == "" {
			return pgx.Identifier{table}.Sanitize()
		}
		return pgx.Identifier{schema, table}.Sanitize()
	}
	return &dialect{
		name: "PostgreSQL",
		skip: noSkip,
		begin: func(lvl Isolation, _ Strategy) []string {
			return []string{"BEGIN ISOLATION LEVEL " + sqlLevel[lvl]}
		},
		forUpdate: " FOR UPDATE",
		// A wait cycle that runs through the lab's barrier is invisible to
		// the deadlock detector: lock_timeout ends it.
		session: []string{"SET lock_timeout = '10s'"},
		createCheck: func(t string, unique bool) []string {
			idx := "CREATE INDEX "
			if unique {
				idx = "CREATE UNIQUE INDEX "
			}
			return []string{
				"CREATE TABLE " + q(t) + " (id bigserial PRIMARY KEY, k text NOT NULL, worker int NOT NULL)",
				idx + pgx.Identifier{t + "_k"}.Sanitize() + " ON " + q(t) + " (k)",
			}
		},
		createInsert: func(t string) []string {
			return []string{"CREATE TABLE " + q(t) + " (k text PRIMARY KEY, worker int NOT NULL)"}
		},
		check:  func(t string) string { return "SELECT 1 FROM " + q(t) + " WHERE k = $1" },
		insert: func(t string) string { return "INSERT INTO " + q(t) + " (k, worker) VALUES ($1, $2)" },
		insertFirst: func(t string) string {
			return "INSERT INTO " + q(t) + " (k, worker) VALUES ($1, $2) ON CONFLICT DO NOTHING"
		},
		countLike: func(t string) string { return "SELECT count(*) FROM " + q(t) + " WHERE k LIKE $1" },
		drop:      func(t string) string { return "DROP TABLE IF EXISTS " + q(t) },
		version:   "SELECT 'PostgreSQL ' || split_part(current_setting('server_version'), ' ', 1)",
		classify:  classifyPostgres,
		qualify:   q,
		open: func(int) (*sql.DB, error) {
			return stdlib.OpenDB(cc), nil
		},
		cleanup: func() {},
	}
}

func mysqlDialect(cfg *mysql.Config) *dialect {
	q := func(table string) string { return "`" + table + "`" }
	return &dialect{
		name: "MySQL",
		skip: noSkip,
		begin: func(lvl Isolation, _ Strategy) []string {
			return []string{"SET TRANSACTION ISOLATION LEVEL " + sqlLevel[lvl], "START TRANSACTION"}
		},
		forUpdate: " FOR UPDATE",
		session:   []string{"SET SESSION innodb_lock_wait_timeout = 10", "SET SESSION lock_wait_timeout = 30"},
		createCheck: func(t string, unique bool) []string {
			idx := "KEY"
			if unique {
				idx = "UNIQUE KEY"
			}
			return []string{"CREATE TABLE " + q(t) + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL, worker INT NOT NULL, " +
				idx + " k_idx (k)) ENGINE=InnoDB"}
		},
		createInsert: func(t string) []string {
			return []string{"CREATE TABLE " + q(t) + " (k VARCHAR(64) PRIMARY KEY, worker INT NOT NULL) ENGINE=InnoDB"}
		},
		check:  func(t string) string { return "SELECT 1 FROM " + q(t) + " WHERE k = ?" },
		insert: func(t string) string { return "INSERT INTO " + q(t) + " (k, worker) VALUES (?, ?)" },
		// A plain INSERT whose duplicate-key error (1062) names the loser,
		// as idemmysql reserves: INSERT IGNORE would also hide other errors.
		insertFirst:      func(t string) string { return "INSERT INTO " + q(t) + " (k, worker) VALUES (?, ?)" },
		loserOnDuplicate: true,
		countLike:        func(t string) string { return "SELECT count(*) FROM " + q(t) + " WHERE k LIKE ?" },
		drop:             func(t string) string { return "DROP TABLE IF EXISTS " + q(t) },
		version:          "SELECT CONCAT(IF(VERSION() LIKE '%MariaDB%', 'MariaDB ', 'MySQL '), SUBSTRING_INDEX(VERSION(), '-', 1))",
		classify:         classifyMySQL,
		backendID:        "SELECT CONNECTION_ID()",
		kill:             func(id int64) string { return fmt.Sprintf("KILL %d", id) },
		qualify:          q,
		open: func(int) (*sql.DB, error) {
			c, err := mysql.NewConnector(cfg)
			if err != nil {
				return nil, err
			}
			return sql.OpenDB(c), nil
		},
		cleanup: func() {},
	}
}

func sqliteDialect(path string, opts idemsqlite.OpenOptions) *dialect {
	q := func(table string) string { return `"` + table + `"` }
	_, statErr := os.Stat(path)
	created := errors.Is(statErr, os.ErrNotExist)
	return &dialect{
		name: "SQLite",
		skip: func(lvl Isolation) string {
			if lvl == Serializable {
				return ""
			}
			return "SQLite runs every transaction serializably (one writer at a time, readers on a snapshot); it has no " + sqlLevel[lvl] + " level"
		},
		beginLocks: func(s Strategy) bool { return s == SelectForUpdate },
		begin: func(_ Isolation, s Strategy) []string {
			if s == SelectForUpdate {
				// No FOR UPDATE in SQLite: the way to lock before reading
				// is to take the database's write lock up front.
				return []string{"BEGIN IMMEDIATE"}
			}
			return []string{"BEGIN DEFERRED"}
		},
		createCheck: func(t string, unique bool) []string {
			idx := "CREATE INDEX "
			if unique {
				idx = "CREATE UNIQUE INDEX "
			}
			return []string{
				"CREATE TABLE " + q(t) + " (id INTEGER PRIMARY KEY, k TEXT NOT NULL, worker INTEGER NOT NULL)",
				idx + q(t+"_k") + " ON " + q(t) + " (k)",
			}
		},
		createInsert: func(t string) []string {
			return []string{"CREATE TABLE " + q(t) + " (k TEXT PRIMARY KEY, worker INTEGER NOT NULL)"}
		},
		check:  func(t string) string { return "SELECT 1 FROM " + q(t) + " WHERE k = ?" },
		insert: func(t string) string { return "INSERT INTO " + q(t) + " (k, worker) VALUES (?, ?)" },
		insertFirst: func(t string) string {
			return "INSERT INTO " + q(t) + " (k, worker) VALUES (?, ?) ON CONFLICT DO NOTHING"
		},
		countLike: func(t string) string { return "SELECT count(*) FROM " + q(t) + " WHERE k LIKE ?" },
		drop:      func(t string) string { return "DROP TABLE IF EXISTS " + q(t) },
		version:   "SELECT 'SQLite ' || sqlite_version()",
		classify:  classifySQLite,
		qualify:   q,
		open: func(conns int) (*sql.DB, error) {
			opts.MaxOpenConns = conns
			// WAL, busy_timeout and the rest as idem's store opens the file.
			// Transactions are begun by hand (BEGIN DEFERRED or IMMEDIATE),
			// so the driver's _txlock does not apply.
			return idemsqlite.Open(path, opts)
		},
		cleanup: func() {
			if created { // leave no empty database file behind
				for _, suffix := range []string{"", "-wal", "-shm"} {
					os.Remove(path + suffix)
				}
			}
		},
	}
}
