package idempg_test

import (
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
	"github.com/idem-dev/idem/internal/tools/storebench"
)

// TestCeilingScript runs bench/ceiling.sh briefly (512 pairs a line, one
// round, no warm-up), with this test binary as the store's benchmark, and
// checks that it ends well and prints every line: the script applies the
// migrations the way Migrate does (in one transaction, which the LOCK
// TABLE of migration 005 needs), so a migration that only works inside
// Migrate, or a change of the store's benchmark that the script no longer
// parses, fails here rather than in the next measurement. With
// pg_stat_statements loaded in the server it also runs STATEMENTS=1.
func TestCeilingScript(t *testing.T) {
	url := testURL(t)
	testenv.Tool(t, "bash", "bash")
	testenv.Tool(t, "psql", "postgresql-client")
	testenv.Tool(t, "pgbench", "postgresql (the server package ships pgbench; scripts/services.sh installs it)")
	if err := exec.Command("pgrep", "-x", "postgres").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no postgres process on this machine and CI=true: the script reads the server's CPU time from /proc")
		}
		t.Skip("no postgres process on this machine: the script reads the server's CPU time from /proc")
	}
	script, err := os.ReadFile("bench/ceiling.sh")
	if err != nil {
		t.Fatal(err)
	}
	// The pgbench lines write the store's rows: the same answer.
	answer := hex.EncodeToString(idemstore.EncodeResponse(storebench.Response))
	if !strings.Contains(string(script), `'\\x`+answer+`'::bytea`) {
		t.Errorf("bench/ceiling.sh's settle does not store the answer the store's benchmark stores (%s)", answer)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var preload string
	if err := testPool(t, "").QueryRow(context.Background(), "SHOW shared_preload_libraries").Scan(&preload); err != nil {
		t.Fatal(err)
	}
	statements := strings.Contains(preload, "pg_stat_statements")
	cmd := exec.Command("bash", "bench/ceiling.sh")
	cmd.Env = append(os.Environ(), "IDEM_TEST_POSTGRES_URL="+url, "PAIRS=512", "WARMUP=0", "ROUNDS=1",
		"STORE_TEST="+self, "STATEMENTS="+map[bool]string{true: "1", false: "0"}[statements])
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench/ceiling.sh: %v\n%s", err, out)
	}
	want := []string{
		`(?m)^# PostgreSQL 1\d`,
		`(?m)^round 1 idem: \d+ pairs/s, HOT settles \d+%, PostgreSQL \d+ cpu-µs/pair, idle \d+%$`,
		`(?m)^round 1 min: \d+ pairs/s, HOT settles \d+%, PostgreSQL \d+ cpu-µs/pair, idle \d+%$`,
		`(?m)^round 1 hot: \d+ pairs/s, HOT settles \d+%, PostgreSQL \d+ cpu-µs/pair, idle \d+%$`,
		`(?m)^round 1 idem-16: \d+ pairs/s, HOT settles \d+%, PostgreSQL \d+ cpu-µs/pair, idle \d+%$`,
		`(?m)^round 1 mixed-16: \d+ pairs/s, HOT settles \d+%, PostgreSQL \d+ cpu-µs/pair, idle \d+%$`,
		`(?m)^round 1 store batch=on c=50: [\d.]+ pairs/s \([\d.]+ calls per batch\), PostgreSQL \d+ cpu-µs/pair, idle \d+% \(its set-up, \d+ ms of PostgreSQL CPU twice, taken out\)$`,
		`(?m)^round 1 store / idem: pairs/s [\d.]+, PostgreSQL CPU per pair [\d.]+$`,
		`(?m)^round 1 store / min: pairs/s [\d.]+, PostgreSQL CPU per pair [\d.]+$`,
		`(?m)^round 1 store / hot: pairs/s [\d.]+, PostgreSQL CPU per pair [\d.]+$`,
		`(?m)^round 1 store / idem-16: pairs/s [\d.]+, PostgreSQL CPU per pair [\d.]+$`,
		`(?m)^round 1 store / mixed-16: pairs/s [\d.]+, PostgreSQL CPU per pair [\d.]+$`,
	}
	if statements {
		want = append(want, `(?m)^ +\d+ \| +32\.0 \| .*INSERT INTO ceil_idem\.idem_records`,
			`(?m)^ +\d+ \| +[\d.]+ \| .*WITH i AS \(SELECT \* FROM unnest`)
	}
	for _, re := range want {
		if !regexp.MustCompile(re).Match(out) {
			t.Errorf("bench/ceiling.sh's output lacks a line matching %s", re)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}
