package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// jsonKeys returns the member names of each object in a JSON array, in
// the order they are written.
func jsonKeys(t *testing.T, data []byte) [][]string {
	t.Helper()
	var rows []json.RawMessage
	if err := json.Unmarshal(data, &rows); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, data)
	}
	var out [][]string
	for _, row := range rows {
		dec := json.NewDecoder(bytes.NewReader(row))
		dec.UseNumber()
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			t.Fatalf("row is not an object: %s", row)
		}
		var keys []string
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k.(string))
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
			switch k {
			case "strategy", "isolation":
				if _, ok := v.(string); !ok {
					t.Errorf("%s is %T, want a string", k, v)
				}
			default:
				if _, ok := v.(json.Number); !ok {
					t.Errorf("%s is %T, want a number", k, v)
				}
			}
		}
		out = append(out, keys)
	}
	return out
}

var wantJSONFields = []string{"strategy", "isolation", "rounds", "max_executions_per_key", "duplicates", "deadlocks", "serialization_failures", "unique_violations", "other_errors", "rounds_per_sec"}

// TestAttackJSONOfARealRun: the JSON of a run holds, per row, exactly the
// ten fields in order, numbers as numbers, and the rows agree with what
// ran.
func TestAttackJSONOfARealRun(t *testing.T) {
	t.Parallel()
	rep, err := Run(t.Context(), Config{Store: "sqlite://" + filepath.Join(t.TempDir(), "lab.db"), Concurrency: 2, Rounds: 3})
	if err != nil {
		t.Fatal(err)
	}
	checkJSON(t, rep, 3, 3)
}

func checkJSON(t *testing.T, rep *Report, rows, rounds int) {
	t.Helper()
	var buf bytes.Buffer
	if err := rep.Write(&buf, FormatJSON); err != nil {
		t.Fatal(err)
	}
	keys := jsonKeys(t, buf.Bytes())
	if len(keys) != rows {
		t.Fatalf("%d rows, want %d:\n%s", len(keys), rows, buf.String())
	}
	for _, k := range keys {
		if !slices.Equal(k, wantJSONFields) {
			t.Errorf("fields %v, want exactly %v", k, wantJSONFields)
		}
	}
	var res []Result
	if err := json.Unmarshal(buf.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Rounds != rounds || r.RoundsPerSec <= 0 {
			t.Errorf("%+v: want %d rounds at a positive rate", r, rounds)
		}
		if r.Strategy == InsertFirst && (r.MaxExecutionsPerKey != 1 || r.Duplicates != 0) {
			t.Errorf("insert-first ran a key twice: %+v", r)
		}
	}
}

// TestAttackHostileConfig: nonsense settings fail before anything is
// opened, each with a message that names the problem.
func TestAttackHostileConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := "sqlite://" + filepath.Join(dir, "x.db")
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"negative concurrency", Config{Store: db, Concurrency: -4}, "concurrency must be between 2 and 64"},
		{"huge concurrency", Config{Store: db, Concurrency: 1 << 30}, "concurrency must be between 2 and 64"},
		{"huge negative rounds", Config{Store: db, Rounds: -1 << 40}, "rounds must be between 1"},
		{"empty isolation", Config{Store: db, Isolations: []Isolation{""}}, `unknown isolation level ""`},
		{"isolation in capitals", Config{Store: db, Isolations: []Isolation{"SERIALIZABLE"}}, "unknown isolation level"},
		{"ftp", Config{Store: "ftp://example.invalid/x"}, "ftp"},
		{"file URL", Config{Store: "file://" + filepath.Join(dir, "x.db")}, "file"},
		{"sqlite without a path", Config{Store: "sqlite://"}, "sqlite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rep, err := Run(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v (report %+v); want an error containing %q", err, rep, tc.want)
			}
		})
	}
	for _, s := range []string{"", " ", ",", "serializable,", "all,serializable", "read committed", "snapshot"} {
		if lvls, err := ParseIsolation(s); err == nil || !strings.Contains(err.Error(), "unknown isolation level") {
			t.Errorf("ParseIsolation(%q) = %v, %v; want an unknown-level error", s, lvls, err)
		}
	}
}

// TestAttackServerJSON: on PostgreSQL and MariaDB, one level, every
// strategy: the JSON has the ten fields and insert-first never runs a key
// twice.
func TestAttackServerJSON(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"IDEM_TEST_POSTGRES_URL", "IDEM_TEST_MYSQL_DSN"} {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			store := serverStore(t, env)
			rep, err := Run(t.Context(), Config{Store: store, Concurrency: 3, Rounds: 4, Isolations: []Isolation{Serializable}})
			if err != nil {
				t.Fatal(err)
			}
			checkJSON(t, rep, 3, 4)
			assertNoLabTables(t, store, rep.Tables)
		})
	}
}
