package chaos_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/chaos"
	"github.com/idem-dev/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/testenv"
)

var chaosDuration = flag.Duration("chaos.duration", 0,
	"fault phase per store (default 20s, 8s with -short, 3m with IDEM_CHAOS=long)")

// faultPhase is how long each store's faults last.
func faultPhase() time.Duration {
	switch {
	case *chaosDuration > 0:
		return *chaosDuration
	case os.Getenv("IDEM_CHAOS") == "long":
		return 3 * time.Minute
	case testing.Short():
		return 8 * time.Second
	}
	return 20 * time.Second
}

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	binErr    error
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// idemBinary builds `idem` once per test binary, with the race detector
// when this test runs with it (IDEM_CHAOS_RACE=0 or 1 overrides), so the
// proxies' own races are reported too.
func idemBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "idem-chaos-")
		if binErr != nil {
			return
		}
		race := raceEnabled
		switch os.Getenv("IDEM_CHAOS_RACE") {
		case "0":
			race = false
		case "1":
			race = true
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		binPath, binErr = chaos.Build(ctx, binDir, race)
	})
	if binErr != nil {
		t.Fatalf("building idem: %v", binErr)
	}
	return binPath
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// openInspect opens the store at rawURL directly (no relay), migrated, for
// the checks.
func openInspect(t *testing.T, rawURL string) idemstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, closeFn, err := storeurl.Open(ctx, rawURL, storeurl.Options{Migrate: true})
	if err != nil {
		t.Fatalf("opening %s: %v", storeurl.Redact(rawURL), err)
	}
	t.Cleanup(func() { _ = closeFn() })
	return s
}

func newRelay(t *testing.T, target string) *chaos.Relay {
	t.Helper()
	r, err := chaos.NewRelay(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// run runs sc and reports its counts and every broken invariant.
func run(t *testing.T, sc *chaos.Scenario) *chaos.Outcome {
	t.Helper()
	sc.Bin = idemBinary(t)
	sc.Dir = t.TempDir()
	if keep := os.Getenv("IDEM_CHAOS_LOGS"); keep != "" {
		// Keep the proxies' configuration and logs after the test.
		sc.Dir = filepath.Join(keep, t.Name())
		if err := os.MkdirAll(sc.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if sc.Duration == 0 {
		sc.Duration = faultPhase()
	}
	sc.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), sc.Duration+5*time.Minute)
	defer cancel()
	out, err := sc.Run(ctx)
	if err != nil {
		for _, p := range out.Procs {
			t.Logf("%s log (last lines):\n%s", p.Name, p.Tail(30))
		}
		t.Fatalf("chaos %s: %v", sc.Name, err)
	}
	rep := out.Report
	t.Logf("chaos %s: %s", sc.Name, rep.Summary())
	t.Logf("chaos %s: %s; %d proxy starts; recovery took %v", sc.Name, out.FaultLine(), starts(out.Procs), out.Recovery.Round(time.Millisecond))
	t.Logf("chaos %s: answers by status: %s", sc.Name, rep.StatusLine())
	for _, a := range out.Alarms {
		t.Errorf("chaos %s: a proxy reported: %s", sc.Name, a)
	}
	return out
}

// requireClean fails the test for every broken invariant, with the key's
// history, and for a run too thin to have tested anything.
func requireClean(t *testing.T, name string, out *chaos.Outcome) {
	t.Helper()
	rep := out.Report
	seen := map[chaos.ExecKey]bool{}
	for _, v := range rep.Violations {
		t.Errorf("chaos %s: %s", name, v.What)
		if !seen[v.Key] && len(seen) < 10 {
			seen[v.Key] = true
			t.Logf("history of %s", rep.History(v.Key))
		}
	}
	if len(rep.Violations) > 0 {
		for _, p := range out.Procs {
			t.Logf("%s log: %s", p.Name, p.LogPath)
		}
	}
	// A run that executed nothing, replayed nothing or injected no fault
	// proves nothing.
	if rep.Executions == 0 || rep.Replays == 0 || len(out.Faults) == 0 {
		t.Errorf("chaos %s: too little happened to check anything: %s; %s", name, rep.Summary(), out.FaultLine())
	}
}

func starts(procs []*chaos.Proc) int {
	n := 0
	for _, p := range procs {
		n += p.Starts()
	}
	return n
}

// TestChaosSQLite is the baseline: three proxies share one SQLite file;
// the faults are the upstream's and the proxies' (kill -9, SIGTERM).
func TestChaosSQLite(t *testing.T) {
	u := "sqlite://" + filepath.Join(t.TempDir(), "idem.db")
	sc := &chaos.Scenario{Name: "sqlite", StoreURL: u, Inspect: openInspect(t, u)}
	requireClean(t, "sqlite", run(t, sc))
}

// TestChaosPostgres runs three proxies on one PostgreSQL schema, through a
// relay that cuts connections, drops replies (COMMIT's among them) and
// emulates outages.
func TestChaosPostgres(t *testing.T) {
	base := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	schema := "chaos_" + randomHex(6)
	direct := testenv.WithParam(base, "schema", schema)
	inspect := openInspect(t, direct) // creates the schema
	t.Cleanup(func() { dropSchema(t, base, schema) })

	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	relay := newRelay(t, u.Host)
	u.Host = relay.Addr()
	q := u.Query()
	q.Set("connect_timeout", "3")
	u.RawQuery = q.Encode()
	sc := &chaos.Scenario{
		Name: "postgres", StoreURL: u.String(), Inspect: inspect, Relay: relay,
		DropPatterns: [][]byte{[]byte("COMMIT"), []byte("INSERT"), []byte("UPDATE"), []byte("DELETE")},
	}
	requireClean(t, "postgres", run(t, sc))
}

func dropSchema(t *testing.T, base, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Errorf("dropping schema %s: %v", schema, err)
		return
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("dropping schema %s: %v", schema, err)
	}
}

// TestChaosMySQL runs three proxies on one MySQL/MariaDB database, through
// the relay.
func TestChaosMySQL(t *testing.T) {
	cfg, err := mysql.ParseDSN(testenv.Getenv(t, "IDEM_TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatalf("IDEM_TEST_MYSQL_DSN: %v", err)
	}
	name := "idem_chaos_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	direct := cfg.Clone()
	direct.DBName = name
	inspect := openInspect(t, "mysql://"+direct.FormatDSN())

	relay := newRelay(t, cfg.Addr)
	proxied := direct.Clone()
	proxied.Addr = relay.Addr()
	proxied.Timeout = 3 * time.Second
	sc := &chaos.Scenario{
		Name: "mysql", StoreURL: "mysql://" + proxied.FormatDSN(), Inspect: inspect, Relay: relay,
		DropPatterns: [][]byte{[]byte("COMMIT"), []byte("INSERT"), []byte("UPDATE"), []byte("DELETE")},
	}
	requireClean(t, "mysql", run(t, sc))
}

// TestChaosRedis runs three proxies on one standalone Redis, under a prefix
// of its own, through the relay, which drops the replies of scripts.
func TestChaosRedis(t *testing.T) {
	base := testenv.Getenv(t, "IDEM_TEST_REDIS_URL")
	prefix := "chaos-" + randomHex(6)
	direct := testenv.WithParam(base, "prefix", prefix)
	inspect := openInspect(t, direct)
	opts, err := redis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePrefix(t, redis.NewClient(opts), prefix) })

	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	relay := newRelay(t, u.Host)
	u.Host = relay.Addr()
	sc := &chaos.Scenario{
		Name: "redis", StoreURL: u.String(), Inspect: inspect, Relay: relay,
		DropPatterns: [][]byte{[]byte("EVAL")},
	}
	requireClean(t, "redis", run(t, sc))
}

// TestChaosRedisCluster runs three proxies on the Redis Cluster. There is
// no relay: cluster nodes announce their own addresses, so clients would
// bypass it after the first redirection. The faults are the upstream's and
// the proxies'.
func TestChaosRedisCluster(t *testing.T) {
	seeds := testenv.Getenv(t, "IDEM_TEST_REDIS_CLUSTER")
	prefix := "chaos-" + randomHex(6)
	u := "redis+cluster://" + seeds + "?prefix=" + prefix
	if strings.Contains(seeds, "://") {
		u = testenv.WithParam(seeds, "prefix", prefix)
	}
	inspect := openInspect(t, u)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(strings.TrimPrefix(seeds, "redis+cluster://"), ",")})
	t.Cleanup(func() { deletePrefix(t, cc, prefix) })
	sc := &chaos.Scenario{Name: "redis-cluster", StoreURL: u, Inspect: inspect}
	requireClean(t, "redis-cluster", run(t, sc))
}

// deletePrefix deletes every Redis key under prefix, on every master of a
// cluster, and closes c.
func deletePrefix(t *testing.T, c redis.UniversalClient, prefix string) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := func(ctx context.Context, n redis.Cmdable) error {
		iter := n.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			if err := n.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return del(ctx, n) })
	} else {
		err = del(ctx, c)
	}
	if err != nil {
		t.Errorf("deleting the keys under %s: %v", prefix, err)
	}
}

// TestChaosCatchesDuplicates shows that the checks catch what they look
// for: with ambiguous: release, an upstream that acted and then reset the
// connection gets the key released, and the client's retry runs it again.
func TestChaosCatchesDuplicates(t *testing.T) {
	u := "sqlite://" + filepath.Join(t.TempDir(), "idem.db")
	sc := &chaos.Scenario{
		Name: "sqlite-ambiguous-release", StoreURL: u, Inspect: openInspect(t, u),
		Ambiguous: "release",
		Mix:       chaos.Mix{chaos.FaultNone: 1, chaos.FaultReset: 1},
		Duration:  min(faultPhase(), 5*time.Second),
	}
	out := run(t, sc)
	if out.Report.Duplicates == 0 {
		t.Fatalf("no duplicate found with ambiguous: release and %s; %s", out.FaultLine(), out.Report.Summary())
	}
	found := false
	for _, v := range out.Report.Violations {
		if strings.HasPrefix(v.What, "duplicate:") {
			found = true
			break
		}
	}
	if !found {
		t.Fatalf("%d duplicates counted but none reported as a violation", out.Report.Duplicates)
	}
}
