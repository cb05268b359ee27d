package idemmysql_test

import (
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

// TestFloorScript runs bench/floor.sh briefly (one round, a few batches
// a connection, 512 pairs of the store), with this test binary as the
// store's benchmark, and checks that it ends well and prints every line:
// a migration that mysql cannot apply from the script, or a change of the
// store's benchmark that the script no longer parses, fails here rather
// than in the next measurement.
func TestFloorScript(t *testing.T) {
	testDSN(t) // skips, or fails with CI=true, without a server
	dsn := os.Getenv(dsnEnv)
	testenv.Tool(t, "bash", "bash")
	testenv.Tool(t, "mysql", "mariadb-client")
	testenv.Tool(t, "mysqlslap", "mariadb-client (a dependency of the server that scripts/services.sh installs)")
	if exec.Command("pgrep", "-x", "mariadbd").Run() != nil && exec.Command("pgrep", "-x", "mysqld").Run() != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no mariadbd or mysqld process on this machine and CI=true: the script reads the server's CPU time from /proc")
		}
		t.Skip("no mariadbd or mysqld process on this machine: the script reads the server's CPU time from /proc")
	}
	script, err := os.ReadFile("bench/floor.sh")
	if err != nil {
		t.Fatal(err)
	}
	// mysqlslap writes the store's rows: the same answer.
	answer := hex.EncodeToString(idemstore.EncodeResponse(storebench.Response))
	if !strings.Contains(string(script), "X'"+answer+"'") {
		t.Errorf("bench/floor.sh's settle does not store the answer the store's benchmark stores (%s)", answer)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "bench/floor.sh")
	cmd.Env = append(os.Environ(), "IDEM_TEST_MYSQL_DSN="+dsn, "ROUNDS=1", "SETS=4", "PAIRS=512", "STORE_TEST="+self)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench/floor.sh: %v\n%s", err, out)
	}
	for _, re := range []string{
		`(?m)^# .*; \d+ CPUs, load `,
		`(?m)^idem     round 1: \d+ pairs/s, server \d+ cpu-µs/pair \(\d+ pairs\)$`,
		`(?m)^minimal  round 1: \d+ pairs/s, server \d+ cpu-µs/pair \(\d+ pairs\)$`,
		`(?m)^store    round 1: [\d.]+ pairs/s \([\d.]+ calls per batch\), server \d+ cpu-µs/pair \(512 pairs`,
		`(?m)^round 1 store / idem: server CPU per pair [\d.]+$`,
		`(?m)^round 1 store / minimal: server CPU per pair [\d.]+$`,
	} {
		if !regexp.MustCompile(re).Match(out) {
			t.Errorf("bench/floor.sh's output lacks a line matching %s", re)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}
