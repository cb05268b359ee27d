package lab

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/testenv"
)

func result(t *testing.T, rep *Report, s Strategy, lvl Isolation) Result {
	t.Helper()
	for _, res := range rep.Results {
		if res.Strategy == s && res.Isolation == lvl {
			return res
		}
	}
	t.Fatalf("no row for %s at %s in %+v", s, lvl, rep.Results)
	return Result{}
}

// TestSQLite runs every strategy on a new SQLite file: nothing runs twice,
// the levels SQLite lacks are skipped with a reason, and the file the lab
// created is gone afterwards.
func TestSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lab.db")
	const workers, rounds = 4, 10
	var progress strings.Builder
	rep, err := Run(t.Context(), Config{Store: "sqlite://" + path, Concurrency: workers, Rounds: rounds, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rep.Database, "SQLite 3.") {
		t.Errorf("Database = %q", rep.Database)
	}
	if len(rep.Results) != 3 || len(rep.Skipped) != 2 || rep.Skipped[0].Isolation != ReadCommitted || rep.Skipped[1].Isolation != RepeatableRead {
		t.Fatalf("rows %+v, skipped %+v; want the three strategies at serializable, the other two levels skipped", rep.Results, rep.Skipped)
	}
	for _, res := range rep.Results {
		if res.Rounds != rounds || res.MaxExecutionsPerKey != 1 || res.Duplicates != 0 || res.OtherErrors != 0 || res.UniqueViolations != 0 {
			t.Errorf("%s: %+v; want one execution per key and no other errors", res.Strategy, res)
		}
		if res.Shows == "" || res.RoundsPerSec <= 0 {
			t.Errorf("%s: Shows %q, RoundsPerSec %v", res.Strategy, res.Shows, res.RoundsPerSec)
		}
	}
	// Every worker of a round reads before any writes (the barrier), so each
	// loser of check-then-insert holds a snapshot and is refused the write.
	cti := result(t, rep, CheckThenInsert, Serializable)
	if got := cti.Deadlocks + cti.SerializationFailures; got != rounds*(workers-1) {
		t.Errorf("check-then-insert: %d refused writes, want %d (every loser): %+v", got, rounds*(workers-1), cti)
	}
	// BEGIN IMMEDIATE serializes, ON CONFLICT DO NOTHING answers: no errors.
	for _, s := range []Strategy{SelectForUpdate, InsertFirst} {
		if res := result(t, rep, s, Serializable); res.Deadlocks+res.SerializationFailures != 0 {
			t.Errorf("%s: %+v; want no errors", s, res)
		}
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the lab left the file it created: %v", err)
	}
	for _, want := range []string{"idem lab: SQLite", "serializable, insert-first: 10 rounds", "read-committed skipped"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
}

// existingSQLite makes a SQLite file with a table of its own, as an
// application (or idem) would have.
func existingSQLite(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE orders (id INTEGER PRIMARY KEY); INSERT INTO orders VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	return path
}

// sqliteTables lists the tables of the file at path.
func sqliteTables(t *testing.T, path string) []string {
	t.Helper()
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return queryNames(t, db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
}

func queryNames(t *testing.T, db *sql.DB, query string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// TestSQLiteExistingFileKept: in a file that was there, the lab leaves the
// file and its tables, and drops its own.
func TestSQLiteExistingFileKept(t *testing.T) {
	t.Parallel()
	path := existingSQLite(t)
	rep, err := Run(t.Context(), Config{Store: "sqlite://" + path, Concurrency: 2, Rounds: 2, Strategies: []Strategy{InsertFirst}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Tables) != 2 || !strings.HasPrefix(rep.Tables[0], "idem_lab_") {
		t.Errorf("Tables = %v", rep.Tables)
	}
	if got := sqliteTables(t, path); strings.Join(got, ",") != "orders" {
		t.Fatalf("tables after the run: %v; want only orders", got)
	}
}

// TestCancelDropsTables: a run cancelled mid-way (as by Ctrl-C) stops,
// says so, and drops its tables.
func TestCancelDropsTables(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"between rounds", "at the barrier"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			path := existingSQLite(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			cfg := Config{Store: "sqlite://" + path, Concurrency: 3, Rounds: 50}
			if where == "between rounds" {
				cfg.afterRound = func(cell, round int) {
					if cell == 2 && round == 3 {
						cancel()
					}
				}
			} else {
				cfg.onArrive = func(cell, round, worker int) {
					if cell == 1 && round == 2 && worker == 2 {
						cancel()
					}
				}
			}
			rep, err := Run(ctx, cfg)
			if !errors.Is(err, context.Canceled) || rep != nil {
				t.Fatalf("Run = %v, %v; want context.Canceled", rep, err)
			}
			if !strings.Contains(err.Error(), "interrupted in serializable") || !strings.Contains(err.Error(), "scratch tables were dropped") {
				t.Errorf("error %q does not say where it stopped and that the tables are gone", err)
			}
			if got := sqliteTables(t, path); strings.Join(got, ",") != "orders" {
				t.Fatalf("tables after the cancelled run: %v; want only orders", got)
			}
		})
	}
}

// TestTakenNameKept: a table that has the name the lab chose (another
// run's, by a one in four billion chance) is an error, and is not dropped.
func TestTakenNameKept(t *testing.T) {
	t.Parallel()
	path := existingSQLite(t)
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE idem_lab_taken_insert (k TEXT PRIMARY KEY, worker INTEGER); INSERT INTO idem_lab_taken_insert VALUES ('mine', 1)`); err != nil {
		t.Fatal(err)
	}
	_, err = Run(t.Context(), Config{Store: "sqlite://" + path, tableBase: "idem_lab_taken"})
	if err == nil || !strings.Contains(err.Error(), "creating the scratch table idem_lab_taken_insert") {
		t.Fatalf("Run = %v; want an error creating idem_lab_taken_insert", err)
	}
	if got := strings.Join(sqliteTables(t, path), ","); got != "idem_lab_taken_insert,orders" {
		t.Fatalf("tables after the run: %s; want the taken one kept and the lab's own dropped", got)
	}
	var k string
	if err := db.QueryRow("SELECT k FROM idem_lab_taken_insert").Scan(&k); err != nil || k != "mine" {
		t.Fatalf("the taken table's row: %q, %v", k, err)
	}
}

// TestSQLiteNotWritable: a file the lab cannot write is an error, not a
// report of nothing.
func TestSQLiteNotWritable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := Run(t.Context(), Config{Store: "sqlite://" + dir}) // a directory
	if err == nil {
		t.Fatal("Run on a directory succeeded")
	}
}

// serverStore returns the store URL of a server the environment names.
func serverStore(t *testing.T, env string) string {
	v := testenv.Getenv(t, env)
	if env == "IDEM_TEST_MYSQL_DSN" && !strings.HasPrefix(v, "mysql://") {
		v = "mysql://" + v
	}
	return v
}

// TestServerClaims checks, on PostgreSQL and MariaDB, the claims of
// docs/why-insert-first.md that do not depend on the output format (the
// command's JSON is checked in cmd/idem): the counts agree with the rows
// the database holds (Run checks this itself), and a unique constraint on
// the check strategies' table turns duplicates into errors.
func TestServerClaims(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"IDEM_TEST_POSTGRES_URL", "IDEM_TEST_MYSQL_DSN"} {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			store := serverStore(t, env)
			rep, err := Run(t.Context(), Config{Store: store, Concurrency: 3, Rounds: 5, Isolations: []Isolation{ReadCommitted},
				Strategies: []Strategy{CheckThenInsert, InsertFirst}, UniqueCheckTable: true})
			if err != nil {
				t.Fatal(err)
			}
			cti := result(t, rep, CheckThenInsert, ReadCommitted)
			if cti.Duplicates != 0 || cti.UniqueViolations != 5*2 || !strings.Contains(cti.Shows, "unique constraint") {
				t.Errorf("check-then-insert with a unique constraint: %+v; want every loser refused by it", cti)
			}
			if res := result(t, rep, InsertFirst, ReadCommitted); res.Duplicates != 0 || res.UniqueViolations != 0 || res.MaxExecutionsPerKey != 1 {
				t.Errorf("insert-first: %+v", res)
			}
			assertNoLabTables(t, store, rep.Tables)
		})
	}
}

// TestServerCancelDropsTables: Ctrl-C while workers hold locks (the gap
// locks of select-for-update at REPEATABLE READ, waiting at the barrier)
// still drops the tables.
func TestServerCancelDropsTables(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"IDEM_TEST_POSTGRES_URL", "IDEM_TEST_MYSQL_DSN"} {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			store := serverStore(t, env)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var progress strings.Builder
			rep, err := Run(ctx, Config{Store: store, Concurrency: 4, Rounds: 50, Isolations: []Isolation{RepeatableRead},
				Strategies: []Strategy{SelectForUpdate}, Progress: &progress,
				onArrive: func(cell, round, worker int) {
					if round == 2 && worker == 3 {
						cancel()
					}
				}})
			if !errors.Is(err, context.Canceled) || rep != nil {
				t.Fatalf("Run = %v, %v; want context.Canceled", rep, err)
			}
			tables := regexp.MustCompile(`idem_lab_[0-9a-f]{8}_(check|insert)`).FindAllString(progress.String(), -1)
			if len(tables) != 2 {
				t.Fatalf("the progress does not name the two tables:\n%s", progress.String())
			}
			assertNoLabTables(t, store, tables)
		})
	}
}

// assertNoLabTables fails if any of tables is still in the database store
// names.
func assertNoLabTables(t *testing.T, store string, tables []string) {
	t.Helper()
	target, err := storeurl.Parse(store)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dialectFor(target)
	if err != nil {
		t.Fatal(err)
	}
	db, err := d.open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	q := "SELECT table_name FROM information_schema.tables WHERE table_name = ? AND table_schema = DATABASE()"
	if d.name == "PostgreSQL" {
		q = "SELECT table_name FROM information_schema.tables WHERE table_name = $1"
	}
	for _, name := range tables {
		if got := queryNames(t, db, q, name); len(got) != 0 {
			t.Errorf("table %s is still there", name)
		}
	}
}
