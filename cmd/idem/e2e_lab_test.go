package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/internal/lab"
	"github.com/idem-dev/idem/internal/testenv"
)

// labRow is one row of idem lab --format json.
type labRow = lab.Result

// runLab runs idem lab with args and --format json, checks that every row
// has exactly the ten fields the issue names, and returns the rows by
// "strategy@isolation".
func runLab(t *testing.T, args ...string) map[string]labRow {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"lab", "--format", "json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("idem lab %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(stdout.Bytes(), &raw); err != nil {
		t.Fatalf("idem lab output is not a JSON array: %v\n%s", err, stdout.String())
	}
	want := []string{"deadlocks", "duplicates", "isolation", "max_executions_per_key", "other_errors", "rounds",
		"rounds_per_sec", "serialization_failures", "strategy", "unique_violations"}
	var rows []labRow
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	byName := map[string]labRow{}
	for i, r := range raw {
		var keys []string
		for k := range r {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want) {
			t.Errorf("row %d has fields %v, want exactly %v", i, keys, want)
		}
		row := rows[i]
		if row.OtherErrors != 0 {
			t.Errorf("%s at %s: %d other errors\n%s", row.Strategy, row.Isolation, row.OtherErrors, stderr.String())
		}
		byName[string(row.Strategy)+"@"+string(row.Isolation)] = row
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("idem lab %s:\n%s\n%s", strings.Join(args, " "), stdout.String(), stderr.String())
		}
	})
	return byName
}

func labRowOf(t *testing.T, rows map[string]labRow, strategy, isolation string) labRow {
	t.Helper()
	r, ok := rows[strategy+"@"+isolation]
	if !ok {
		t.Fatalf("no row for %s at %s", strategy, isolation)
	}
	return r
}

// assertInsertFirstClean: insert-first shows 0 duplicates and 0 deadlocks
// at every level, and one execution per key.
func assertInsertFirstClean(t *testing.T, rows map[string]labRow, levels ...string) {
	t.Helper()
	for _, lvl := range levels {
		r := labRowOf(t, rows, "insert-first", lvl)
		if r.Duplicates != 0 || r.Deadlocks != 0 || r.MaxExecutionsPerKey != 1 {
			t.Errorf("insert-first at %s: %+v; want one execution per key, no duplicates, no deadlocks", lvl, r)
		}
	}
}

var allLevels = []string{"read-committed", "repeatable-read", "serializable"}

// TestLabPostgres checks the claims on PostgreSQL: check-then-insert lets
// duplicates through at READ COMMITTED, SELECT … FOR UPDATE of a missing
// row locks nothing below SERIALIZABLE, SERIALIZABLE fails the first two
// strategies' losers with serialization errors, and insert-first neither
// duplicates nor deadlocks. The barrier makes every round race, so a few
// rounds are enough and the counts are not luck.
func TestLabPostgres(t *testing.T) {
	t.Parallel()
	rows := runLab(t, "--store", testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL"), "--concurrency", "4", "--rounds", "8")
	if len(rows) != 9 {
		t.Fatalf("%d rows, want 9", len(rows))
	}
	for _, lvl := range []string{"read-committed", "repeatable-read"} {
		for _, s := range []string{"check-then-insert", "select-for-update"} {
			if r := labRowOf(t, rows, s, lvl); r.Duplicates == 0 || r.MaxExecutionsPerKey < 2 {
				t.Errorf("%s at %s: %+v; want duplicates", s, lvl, r)
			}
		}
	}
	for _, s := range []string{"check-then-insert", "select-for-update"} {
		if r := labRowOf(t, rows, s, "serializable"); r.SerializationFailures == 0 || r.Duplicates != 0 {
			t.Errorf("%s at serializable: %+v; want serialization failures and no duplicates", s, r)
		}
	}
	assertInsertFirstClean(t, rows, allLevels...)
}

// TestLabMariaDB checks the claims on MariaDB (or MySQL): SELECT … FOR
// UPDATE of a missing row deadlocks at REPEATABLE READ, check-then-insert
// duplicates, and insert-first neither duplicates nor deadlocks.
func TestLabMariaDB(t *testing.T) {
	t.Parallel()
	dsn := testenv.Getenv(t, "IDEM_TEST_MYSQL_DSN")
	if !strings.HasPrefix(dsn, "mysql://") {
		dsn = "mysql://" + dsn
	}
	rows := runLab(t, "--store", dsn, "--concurrency", "4", "--rounds", "8")
	if len(rows) != 9 {
		t.Fatalf("%d rows, want 9", len(rows))
	}
	if r := labRowOf(t, rows, "select-for-update", "repeatable-read"); r.Deadlocks == 0 || r.Duplicates != 0 {
		t.Errorf("select-for-update at repeatable-read: %+v; want deadlocks and no duplicates", r)
	}
	for _, lvl := range []string{"read-committed", "repeatable-read"} {
		if r := labRowOf(t, rows, "check-then-insert", lvl); r.Duplicates == 0 {
			t.Errorf("check-then-insert at %s: %+v; want duplicates", lvl, r)
		}
	}
	assertInsertFirstClean(t, rows, allLevels...)
}

// TestLabSQLite runs the lab with its defaults on SQLite: serializable
// only, no duplicates anywhere, the other levels skipped with a reason.
func TestLabSQLite(t *testing.T) {
	t.Parallel()
	rows := runLab(t, "--store", "sqlite://"+filepath.Join(t.TempDir(), "lab.db"))
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3 (serializable only)", len(rows))
	}
	for _, s := range []string{"check-then-insert", "select-for-update", "insert-first"} {
		if r := labRowOf(t, rows, s, "serializable"); r.Duplicates != 0 || r.Rounds != 100 {
			t.Errorf("%s: %+v; want 100 rounds, no duplicates", s, r)
		}
	}
	assertInsertFirstClean(t, rows, "serializable")

	out, err := exec.Command(binary, "lab", "--store", "sqlite://"+filepath.Join(t.TempDir(), "lab.db"),
		"--rounds", "3", "--concurrency", "2", "--format", "markdown").CombinedOutput()
	if err != nil {
		t.Fatalf("idem lab --format markdown: %v\n%s", err, out)
	}
	for _, w := range []string{"| strategy | isolation |", "| `insert-first` | `serializable` | 3 | 1 | 0 | 0 | 0 | 0 | 0 |",
		"Skipped `read-committed`: SQLite runs every transaction serializably", "idem lab: read-committed skipped"} {
		if !strings.Contains(string(out), w) {
			t.Errorf("markdown output lacks %q:\n%s", w, out)
		}
	}
}

// TestLabInterrupt: Ctrl-C stops a long run, exits non-zero, says so, and
// leaves no scratch table in the database.
func TestLabInterrupt(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "lab", "--store", "sqlite://"+path, "--rounds", "100000", "--concurrency", "2")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	var log strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "serializable, check-then-insert …") {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stderr)
	log.Write(rest)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("idem lab did not stop after SIGINT:\n%s", log.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("idem lab after SIGINT: %v; want exit code 1\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "interrupted in serializable") || !strings.Contains(log.String(), "the scratch tables were dropped") {
		t.Errorf("stderr does not say it was interrupted and cleaned up:\n%s", log.String())
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name LIKE 'idem_lab_%'").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d scratch tables or indexes left (%v)", n, err)
	}
}

// TestLabUsage: a wrong command line exits 2 with a message saying what is
// wrong; a store the lab cannot use exits 1.
func TestLabUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"lab"}, 2, "lab needs --store"},
		{[]string{"lab", "--store", "sqlite://x.db", "--format", "xml"}, 2, "--format must be table, json or markdown"},
		{[]string{"lab", "--store", "sqlite://x.db", "--isolation", "snapshot"}, 2, `unknown isolation level "snapshot"`},
		{[]string{"lab", "--store", "sqlite://x.db", "--strategy", "upsert"}, 2, `unknown strategy "upsert"`},
		{[]string{"lab", "--store", "sqlite://x.db", "--concurrency", "1"}, 2, "--concurrency must be between 2 and 64"},
		{[]string{"lab", "--store", "sqlite://x.db", "--rounds", "0"}, 2, "--rounds must be between 1 and 100000"},
		{[]string{"lab", "--store", "sqlite://x.db", "extra"}, 1, "unknown command"},
		{[]string{"lab", "--store", "memory://"}, 1, "idem lab runs on SQL databases"},
	} {
		cmd := exec.Command(binary, tc.args...)
		cmd.Dir = t.TempDir()
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("idem %s: %v\n%s\nwant exit %d and %q", strings.Join(tc.args, " "), err, out, tc.code, tc.want)
		}
	}
	out, err := exec.Command(binary, "lab", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "insert-first") || !strings.Contains(string(out), "--unique-check-table") {
		t.Errorf("idem lab --help: %v\n%s", err, out)
	}
}

// TestLabClosedPipe: piped into a reader that quits early (idem lab | head
// -1), the lab still finishes its run and drops its tables instead of
// dying on SIGPIPE.
func TestLabClosedPipe(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "lab", "--store", "sqlite://"+path, "--rounds", "20", "--concurrency", "2")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	first, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "idem lab: SQLite") {
		t.Fatalf("first line %q, %v", first, err)
	}
	stderr.Close()
	stdout.Close()
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("idem lab died of %v", ws.Signal())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name LIKE 'idem_lab_%'").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d scratch tables or indexes left (%v)", n, err)
	}
}
