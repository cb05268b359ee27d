package lab

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	sqlite3 "modernc.org/sqlite/lib"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("exec: %w", err) }
	for _, tc := range []struct {
		name     string
		classify func(error) errClass
		err      error
		want     errClass
	}{
		{"pg deadlock", classifyPostgres, &pgconn.PgError{Code: "40P01"}, classDeadlock},
		{"pg serialization", classifyPostgres, wrap(&pgconn.PgError{Code: "40001"}), classSerialization},
		{"pg unique", classifyPostgres, &pgconn.PgError{Code: "23505"}, classUnique},
		{"pg lock timeout", classifyPostgres, &pgconn.PgError{Code: "55P03"}, classLockTimeout},
		{"pg syntax", classifyPostgres, &pgconn.PgError{Code: "42601"}, classOther},
		{"pg not a server error", classifyPostgres, context.Canceled, classOther},
		{"mysql deadlock", classifyMySQL, wrap(&mysql.MySQLError{Number: 1213}), classDeadlock},
		{"mysql lock wait timeout", classifyMySQL, &mysql.MySQLError{Number: 1205}, classLockTimeout},
		{"mysql duplicate", classifyMySQL, &mysql.MySQLError{Number: 1062}, classUnique},
		{"mysql no table", classifyMySQL, &mysql.MySQLError{Number: 1146}, classOther},
		{"mysql bad conn", classifyMySQL, mysql.ErrInvalidConn, classOther},
		{"sqlite not a driver error", classifySQLite, errors.New("boom"), classOther},
	} {
		if got := tc.classify(tc.err); got != tc.want {
			t.Errorf("%s: classify(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	for _, tc := range []struct {
		code int
		want errClass
	}{
		{sqlite3.SQLITE_BUSY, classDeadlock},
		{sqlite3.SQLITE_BUSY_SNAPSHOT, classSerialization},
		{sqlite3.SQLITE_BUSY_RECOVERY, classDeadlock},
		{sqlite3.SQLITE_LOCKED, classDeadlock},
		{sqlite3.SQLITE_CONSTRAINT_UNIQUE, classUnique},
		{sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, classUnique},
		{sqlite3.SQLITE_CONSTRAINT_NOTNULL, classOther},
		{sqlite3.SQLITE_IOERR, classOther},
	} {
		if got := classifySQLiteCode(tc.code); got != tc.want {
			t.Errorf("classifySQLiteCode(%d) = %v, want %v", tc.code, got, tc.want)
		}
	}
}
