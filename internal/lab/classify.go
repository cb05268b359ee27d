package lab

import (
	"errors"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// errClass is what the lab counts an error as.
type errClass int

const (
	classOther errClass = iota
	// classDeadlock: the server broke a lock wait cycle (PostgreSQL 40P01,
	// MySQL 1213), or SQLite refused a lock (SQLITE_BUSY: at once where
	// waiting could deadlock, else after busy_timeout).
	classDeadlock
	// classLockTimeout: a lock wait gave up (PostgreSQL 55P03 lock_timeout,
	// MySQL 1205). Counted with the deadlocks: in the lab it means a wait
	// cycle the server could not see, through the barrier.
	classLockTimeout
	// classSerialization: the server refused a transaction that could not
	// be ordered after the others (PostgreSQL 40001, SQLite
	// SQLITE_BUSY_SNAPSHOT: a deferred transaction read a snapshot that a
	// concurrent commit made stale, and may not write).
	classSerialization
	// classUnique: a unique constraint refused a second row (PostgreSQL
	// 23505, MySQL 1062, SQLite SQLITE_CONSTRAINT_UNIQUE or _PRIMARYKEY).
	classUnique
)

func (c errClass) String() string {
	switch c {
	case classDeadlock:
		return "deadlock"
	case classLockTimeout:
		return "lock wait timeout"
	case classSerialization:
		return "serialization failure"
	case classUnique:
		return "unique violation"
	}
	return "other error"
}

func classifyPostgres(err error) errClass {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return classOther
	}
	switch pe.Code {
	case "40P01":
		return classDeadlock
	case "55P03":
		return classLockTimeout
	case "40001":
		return classSerialization
	case "23505":
		return classUnique
	}
	return classOther
}

func classifyMySQL(err error) errClass {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return classOther
	}
	switch me.Number {
	case 1213: // ER_LOCK_DEADLOCK
		return classDeadlock
	case 1205: // ER_LOCK_WAIT_TIMEOUT
		return classLockTimeout
	case 1062: // ER_DUP_ENTRY
		return classUnique
	}
	return classOther
}

func classifySQLite(err error) errClass {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return classOther
	}
	return classifySQLiteCode(se.Code())
}

func classifySQLiteCode(code int) errClass {
	switch {
	case code == sqlite3.SQLITE_BUSY_SNAPSHOT:
		return classSerialization
	case code&0xff == sqlite3.SQLITE_BUSY, code&0xff == sqlite3.SQLITE_LOCKED:
		return classDeadlock
	case code == sqlite3.SQLITE_CONSTRAINT_UNIQUE, code == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return classUnique
	}
	return classOther
}
