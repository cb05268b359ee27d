package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/idem-dev/idem/idemstore"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// nativeError returns a real *sqlite.Error with the given result code,
// produced by SQLite itself.
func nativeError(t *testing.T, code int) error {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "e.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	switch code {
	case sqlite3.SQLITE_ERROR:
		_, err = db.Exec("SELEC 1")
	case sqlite3.SQLITE_CONSTRAINT:
		_, err = db.Exec("CREATE TABLE t (a INTEGER PRIMARY KEY); INSERT INTO t VALUES (1); INSERT INTO t VALUES (1)")
	default:
		t.Fatalf("no native recipe for code %d", code)
	}
	var se *sqlite.Error
	if !errors.As(err, &se) || se.Code()&0xff != code {
		t.Fatalf("recipe for %d gave %v", code, err)
	}
	return err
}

func TestInterpretError(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	busy := lockedDatabaseError(t)
	closedErr := closedDBError(t)
	syntax := nativeError(t, sqlite3.SQLITE_ERROR)
	constraint := nativeError(t, sqlite3.SQLITE_CONSTRAINT)

	cases := []struct {
		name    string
		ctx     context.Context
		err     error
		want    error // sentinel the result must wrap; nil: returned unchanged
		wantCtx error
	}{
		{"nil", context.Background(), nil, nil, nil},
		{"busy", context.Background(), busy, idemstore.ErrRetryable, nil},
		{"closed db", context.Background(), closedErr, idemstore.ErrUnavailable, nil},
		{"conn done", context.Background(), sql.ErrConnDone, idemstore.ErrUnavailable, nil},
		{"context canceled kept", context.Background(), context.Canceled, nil, context.Canceled},
		{"wrapped deadline kept", context.Background(), fmt.Errorf("x: %w", context.DeadlineExceeded), nil, context.DeadlineExceeded},
		{"interrupt under cancelled ctx", cancelled, errors.New("interrupted (9)"), nil, context.Canceled},
		{"sentinel passes", context.Background(), fmt.Errorf("y: %w", idemstore.ErrLeaseLost), idemstore.ErrLeaseLost, nil},
		{"syntax unchanged", context.Background(), syntax, nil, nil},
		{"constraint unchanged", context.Background(), constraint, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := interpretError(tc.ctx, tc.err)
			if tc.err == nil {
				if got != nil {
					t.Fatalf("interpretError(nil) = %v", got)
				}
				return
			}
			if !errors.Is(got, tc.err) {
				t.Errorf("%v does not wrap the original %v", got, tc.err)
			}
			if tc.want != nil && !errors.Is(got, tc.want) {
				t.Errorf("%v does not wrap %v", got, tc.want)
			}
			if tc.wantCtx != nil && !errors.Is(got, tc.wantCtx) {
				t.Errorf("%v does not wrap %v", got, tc.wantCtx)
			}
			if tc.want == nil && tc.wantCtx == nil {
				for _, s := range []error{idemstore.ErrRetryable, idemstore.ErrUnavailable} {
					if errors.Is(got, s) {
						t.Errorf("%v unexpectedly wraps %v", got, s)
					}
				}
			}
		})
	}
}

// lockedDatabaseError makes SQLite return SQLITE_BUSY for real: one
// connection holds the write lock while another, with no busy timeout,
// tries to write.
func lockedDatabaseError(t *testing.T) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "busy.db")
	holder, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.Exec("CREATE TABLE t (a INTEGER)"); err != nil {
		t.Fatal(err)
	}
	tx, err := holder.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, err = other.Exec("INSERT INTO t VALUES (2)")
	var se *sqlite.Error
	if !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_BUSY {
		t.Fatalf("want SQLITE_BUSY, got %v", err)
	}
	return err
}

// closedDBError returns what database/sql says about a closed *sql.DB.
func closedDBError(t *testing.T) error {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "closed.db"))
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	err = db.Ping()
	if err == nil {
		t.Fatal("ping on closed db succeeded")
	}
	return err
}
