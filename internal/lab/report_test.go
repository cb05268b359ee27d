package lab

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// jsonFields are the fields the issue names, in order.
var jsonFields = []string{"strategy", "isolation", "rounds", "max_executions_per_key", "duplicates", "deadlocks",
	"serialization_failures", "unique_violations", "other_errors", "rounds_per_sec"}

func sampleReport() *Report {
	return &Report{
		Database: "PostgreSQL 15.20", Store: "postgres://u:xxxxx@h/db", Concurrency: 8, Rounds: 100, Barrier: true,
		Results: []Result{
			{Strategy: CheckThenInsert, Isolation: ReadCommitted, Rounds: 100, MaxExecutionsPerKey: 8, Duplicates: 700,
				RoundsPerSec: 123.456, Shows: "Seven of | eight ran twice.", NoWinnerRounds: 3, FirstOtherError: "x"},
			{Strategy: InsertFirst, Isolation: Serializable, Rounds: 100, MaxExecutionsPerKey: 1, SerializationFailures: 5,
				RoundsPerSec: 99, Shows: "One ran."},
		},
		Skipped: []Skipped{{Isolation: RepeatableRead, Reason: "not here"}},
	}
}

// TestJSONHasExactlyTheFields: each row has the ten fields and nothing else
// (no "shows", no internal counts), in the order.
func TestJSONHasExactlyTheFields(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := sampleReport().Write(&buf, FormatJSON); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rows); err != nil {
		t.Fatalf("not a JSON array of objects: %v\n%s", err, buf.String())
	}
	if len(rows) != 2 {
		t.Fatalf("got %d rows, want 2", len(rows))
	}
	for _, row := range rows {
		var keys []string
		for k := range row {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		want := slices.Clone(jsonFields)
		slices.Sort(want)
		if !slices.Equal(keys, want) {
			t.Errorf("fields %v, want exactly %v", keys, want)
		}
	}
	// In the order, too.
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	var order []string
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '{' || v == '[' {
				depth++
			} else {
				depth--
			}
		case string:
			if depth == 2 && len(order) < len(jsonFields) && dec.More() {
				order = append(order, v)
				dec.Token() // its value
			}
		}
	}
	if !slices.Equal(order, jsonFields) {
		t.Errorf("first row's fields in order %v, want %v", order, jsonFields)
	}
	if rows[0]["duplicates"] != 700.0 || rows[1]["serialization_failures"] != 5.0 || rows[0]["strategy"] != "check-then-insert" {
		t.Errorf("values lost: %v", rows)
	}
}

func TestJSONOfNoRowsIsAnEmptyArray(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := (&Report{}).Write(&buf, FormatJSON); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(buf.String()); got != "[]" {
		t.Fatalf("got %s, want []", got)
	}
}

func TestTableAndMarkdown(t *testing.T) {
	t.Parallel()
	var table, md bytes.Buffer
	rep := sampleReport()
	if err := rep.Write(&table, FormatTable); err != nil {
		t.Fatal(err)
	}
	if err := rep.Write(&md, FormatMarkdown); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"PostgreSQL 15.20: 8 workers race for each key, 100 keys per row; every worker waits at a barrier",
		"strategy           isolation       rounds  max/key  duplicates",
		"check-then-insert  read-committed  100     8        700",
		"123.5",
		"What this shows:\n  check-then-insert at read-committed: Seven of | eight ran twice.\n  insert-first at serializable: One ran.",
		"Skipped repeatable-read: not here.",
	} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	for _, want := range []string{
		"| strategy | isolation | rounds | max executions per key |",
		"| `check-then-insert` | `read-committed` | 100 | 8 | 700 | 0 | 0 | 0 | 0 | 123.5 | Seven of \\| eight ran twice. |",
		"Skipped `repeatable-read`: not here.",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if err := rep.Write(&table, "xml"); err == nil || !strings.Contains(err.Error(), "unknown format") {
		t.Errorf("Write(xml) = %v; want an unknown-format error", err)
	}
}

// TestShows: the plain-words line follows the numbers, whatever the
// database did.
func TestShows(t *testing.T) {
	t.Parallel()
	cfg := Config{Concurrency: 4}
	for _, tc := range []struct {
		db   string
		res  Result
		want []string
	}{
		{"PostgreSQL", Result{Strategy: CheckThenInsert, Isolation: ReadCommitted, Rounds: 10, MaxExecutionsPerKey: 4, Duplicates: 30},
			[]string{"Up to 4 of 4 workers ran the operation for one key, 30 duplicate executions over 10 keys, and no errors. Why: at READ COMMITTED"}},
		{"MySQL", Result{Strategy: SelectForUpdate, Isolation: RepeatableRead, Rounds: 10, MaxExecutionsPerKey: 1, Deadlocks: 30, LockTimeouts: 2},
			[]string{"One execution per key, but 30 deadlocks reached the losers' clients. Why: FOR UPDATE on a key that is not there takes a gap lock",
				"; 2 of the deadlocks were lock wait timeouts."}},
		{"PostgreSQL", Result{Strategy: CheckThenInsert, Isolation: Serializable, Rounds: 10, MaxExecutionsPerKey: 1, SerializationFailures: 29, NoWinnerRounds: 1, UniqueViolations: 2},
			[]string{"At most one execution per key, but 29 serialization failures and 2 unique violations reached the losers' clients; 1 keys ran nowhere",
				"the unique constraint on the key refused each second row"}},
		{"SQLite", Result{Strategy: InsertFirst, Isolation: Serializable, Rounds: 10, MaxExecutionsPerKey: 1, BarrierTimeouts: 1, OtherErrors: 1, FirstOtherError: "disk I/O error"},
			[]string{"but 1 other errors reached", "in 1 rounds a worker did not reach the barrier in 5s", "first other error: disk I/O error."}},
		{"SQLite", Result{Strategy: CheckThenInsert, Isolation: Serializable, Rounds: 3, Deadlocks: 12, NoWinnerRounds: 3},
			[]string{"No key ran at all, but 12 deadlocks reached"}},
	} {
		got := shows(tc.db, tc.res, cfg)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("shows(%s, %s, %s) = %q; want it to contain %q", tc.db, tc.res.Strategy, tc.res.Isolation, got, w)
			}
		}
	}
}

// TestEveryRowIsExplained: every strategy at every level a database runs
// has its "why".
func TestEveryRowIsExplained(t *testing.T) {
	t.Parallel()
	for db, levels := range map[string][]Isolation{"PostgreSQL": Isolations, "MySQL": Isolations, "SQLite": {Serializable}} {
		for _, s := range Strategies {
			for _, lvl := range levels {
				if why[db][s][lvl] == "" {
					t.Errorf("no explanation for %s, %s at %s", db, s, lvl)
				}
			}
		}
	}
}
