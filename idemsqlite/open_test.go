package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

func TestOpenPragmas(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		opts idemsqlite.OpenOptions
		want map[string]string
	}{
		{"defaults", idemsqlite.OpenOptions{}, map[string]string{
			"journal_mode": "wal", "synchronous": "1", "busy_timeout": "5000", "foreign_keys": "1",
		}},
		{"full", idemsqlite.OpenOptions{Synchronous: idemsqlite.SynchronousFull, BusyTimeout: 1500 * time.Millisecond},
			map[string]string{"journal_mode": "wal", "synchronous": "2", "busy_timeout": "1500", "foreign_keys": "1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t, tc.opts)
			// Hold several connections at once so the check covers more
			// than the first one the pool made.
			ctx := context.Background()
			var conns []*sql.Conn
			for range 3 {
				c, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			for i, c := range conns {
				for name, want := range tc.want {
					var got string
					if err := c.QueryRowContext(ctx, "PRAGMA "+name).Scan(&got); err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Errorf("conn %d: PRAGMA %s = %q, want %q", i, name, got, want)
					}
				}
			}
			for _, c := range conns {
				c.Close()
			}
		})
	}
}

// TestOpenTransactionsTakeWriteLock checks _txlock=immediate: a transaction
// holds the write lock from BeginTx on, before it has written anything, so
// a writer elsewhere that will not wait is refused.
func TestOpenTransactionsTakeWriteLock(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lock.db")
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE t (a INTEGER)"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()

	other, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Exec("INSERT INTO t VALUES (1)"); err == nil {
		t.Fatal("a write succeeded while a transaction begun with Open's settings was open")
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec("INSERT INTO t VALUES (1)"); err != nil {
		t.Fatalf("write after rollback: %v", err)
	}
}

func TestOpenRejectsBadOptions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name string
		path string
		opts idemsqlite.OpenOptions
	}{
		{"empty path", "", idemsqlite.OpenOptions{}},
		{"query in path", filepath.Join(dir, "a.db?mode=ro"), idemsqlite.OpenOptions{}},
		{"file uri", "file:" + filepath.Join(dir, "a.db"), idemsqlite.OpenOptions{}},
		{"synchronous", filepath.Join(dir, "b.db"), idemsqlite.OpenOptions{Synchronous: "OFF"}},
		{"negative timeout", filepath.Join(dir, "c.db"), idemsqlite.OpenOptions{BusyTimeout: -time.Second}},
		{"negative conns", filepath.Join(dir, "d.db"), idemsqlite.OpenOptions{MaxOpenConns: -1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, err := idemsqlite.Open(tc.path, tc.opts)
			if err == nil {
				db.Close()
				t.Fatalf("Open(%q, %+v) succeeded", tc.path, tc.opts)
			}
		})
	}
}

func TestOpenUnreachablePath(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "missing-dir", "idem.db")
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err == nil {
		db.Close()
		t.Fatal("Open in a missing directory succeeded")
	}
	if !errors.Is(err, idemstore.ErrUnavailable) {
		t.Fatalf("Open in a missing directory: %v, want ErrUnavailable", err)
	}
}
