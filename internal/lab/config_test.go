package lab

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func TestParseIsolation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []Isolation
		err  string
	}{
		{"all", Isolations, ""},
		{"read-committed", []Isolation{ReadCommitted}, ""},
		{"serializable,read-committed", []Isolation{Serializable, ReadCommitted}, ""},
		{" repeatable-read , repeatable-read", []Isolation{RepeatableRead}, ""},
		{"", nil, "unknown isolation level"},
		{"READ COMMITTED", nil, "unknown isolation level"},
		{"read-uncommitted", nil, "unknown isolation level"},
		{"all,serializable", nil, "unknown isolation level"},
	} {
		got, err := ParseIsolation(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseIsolation(%q) = %v, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseIsolation(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseStrategy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []Strategy
		err  bool
	}{
		{"all", Strategies, false},
		{"insert-first", []Strategy{InsertFirst}, false},
		{"select-for-update,check-then-insert", []Strategy{SelectForUpdate, CheckThenInsert}, false},
		{"insert-first,insert-first", []Strategy{InsertFirst}, false},
		{"upsert", nil, true},
		{",", nil, true},
	} {
		got, err := ParseStrategy(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("ParseStrategy(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// TestRunRefusesBadConfig: every misconfiguration fails before anything
// is opened, with a message that names the problem.
func TestRunRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no store", Config{}, "store URL is required"},
		{"one worker", Config{Store: "sqlite://x.db", Concurrency: 1}, "concurrency must be between 2 and 64"},
		{"too many workers", Config{Store: "sqlite://x.db", Concurrency: MaxConcurrency + 1}, "concurrency must be between"},
		{"negative rounds", Config{Store: "sqlite://x.db", Rounds: -1}, "rounds must be between 1"},
		{"too many rounds", Config{Store: "sqlite://x.db", Rounds: MaxRounds + 1}, "rounds must be between 1"},
		{"no levels", Config{Store: "sqlite://x.db", Isolations: []Isolation{}}, "no isolation level"},
		{"unknown level", Config{Store: "sqlite://x.db", Isolations: []Isolation{"snapshot"}}, `unknown isolation level "snapshot"`},
		{"no strategies", Config{Store: "sqlite://x.db", Strategies: []Strategy{}}, "no strategy"},
		{"unknown strategy", Config{Store: "sqlite://x.db", Strategies: []Strategy{"upsert"}}, `unknown strategy "upsert"`},
		{"no scheme", Config{Store: "lab.db"}, "has no scheme"},
		{"memory", Config{Store: "memory://"}, "idem lab runs on SQL databases"},
		{"redis", Config{Store: "redis://127.0.0.1:1/0"}, "idem lab runs on SQL databases"},
		{"redis cluster", Config{Store: "redis+cluster://127.0.0.1:1"}, "idem lab runs on SQL databases"},
		{"mysql without database", Config{Store: "mysql://root@tcp(127.0.0.1:1)/"}, "needs a database name"},
		{"sqlite with a parameter it lacks", Config{Store: "sqlite://x.db?journal=off"}, "unknown sqlite parameter"},
		{"password hidden", Config{Store: "postgres://u:hunter2@127.0.0.1:1/db?sslmode=bogus"}, "xxxxx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Run(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v; want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

// TestRunUnreachable: a server that does not answer fails at once, with the
// URL's password hidden, and creates nothing.
func TestRunUnreachable(t *testing.T) {
	t.Parallel()
	for _, store := range []string{
		"postgres://u:hunter2@127.0.0.1:1/db?sslmode=disable&connect_timeout=5",
		"mysql://u:hunter2@tcp(127.0.0.1:1)/db?timeout=5s",
	} {
		_, err := Run(context.Background(), Config{Store: store})
		if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "xxxxx") {
			t.Errorf("Run(%s): %v; want a connection error with the password hidden", store, err)
		}
	}
}
