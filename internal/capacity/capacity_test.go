package capacity

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/proccpu"
	"github.com/idem-dev/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/testenv"
)

// workers is how many goroutines load records, as many clients would.
const workers = 32

// purgeTimeout bounds one store's purge; a purge that runs out of it is
// scaled from what it deleted in time, and says so.
var purgeTimeout time.Duration

// backend is one store under measurement.
type backend struct {
	// url opens the store (storeurl), in a schema, database, file or key
	// prefix of its own.
	url string
	// size returns the bytes the store's records take now; compact is what
	// they take once rewritten without free space (PostgreSQL's VACUUM
	// FULL), or -1.
	size func(ctx context.Context) (bytes, compact int64, err error)
	// server lists the processes whose CPU counts as the store's server;
	// nil for an in-process store.
	server func() []int
	// open, when set, opens the store instead of storeurl.
	open func() (idemstore.Store, func() error, error)
	// expire, when set, makes records of an hour's retention expire (by
	// moving the store's clock): the store drops records that expired on
	// its own as it writes, so they must expire only after the load.
	// Without it, the expired records are stored with no retention.
	expire func()
}

// envInt reads a positive integer setting, or returns def.
func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// TestCapacity measures bytes per record and purge cost on every store in
// IDEM_CAPACITY_STORES (default all five) and prints a table:
//
//	IDEM_BENCH_CAPACITY=1 go test -run TestCapacity -v ./internal/capacity
//
// IDEM_CAPACITY_RECORDS (default 10000) records of each shape are stored,
// one shape after the other, and the store's growth after each is divided
// by their number; then IDEM_CAPACITY_PURGE (default 100000) records that
// have already expired are stored and purged (batches of 500, as idem
// serve and idem purge do), and the costs are scaled to a million; a
// purge still running after IDEM_CAPACITY_PURGE_TIMEOUT seconds (default
// 300) is stopped and scaled from what it deleted, and its line says so.
// PostgreSQL and MySQL come from IDEM_TEST_POSTGRES_URL and
// IDEM_TEST_MYSQL_DSN; Redis from IDEM_CAPACITY_REDIS_URL, a redis-server
// of the measurement's own (used_memory counts every key on the server).
func TestCapacity(t *testing.T) {
	if os.Getenv("IDEM_BENCH_CAPACITY") != "1" {
		t.Skip("set IDEM_BENCH_CAPACITY=1 to measure bytes per record and purge cost on every store (scripts/bench-capacity.sh)")
	}
	purgeTimeout = time.Duration(envInt(t, "IDEM_CAPACITY_PURGE_TIMEOUT", 300)) * time.Second
	n := envInt(t, "IDEM_CAPACITY_RECORDS", 10000)
	m := envInt(t, "IDEM_CAPACITY_PURGE", 100000)
	stores := strings.Fields(os.Getenv("IDEM_CAPACITY_STORES"))
	if len(stores) == 0 {
		stores = []string{"memory", "sqlite", "postgres", "mysql", "redis"}
	}
	open := map[string]func(*testing.T) backend{
		"memory": memoryBackend, "sqlite": sqliteBackend, "postgres": postgresBackend,
		"mysql": mysqlBackend, "redis": redisBackend,
	}
	fmt.Printf("# %s, %d CPUs, load %s; %d records per shape, %d purged (scaled to 1M), %d loading goroutines\n",
		time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), loadavg(), n, m, workers)
	fmt.Printf("%-9s %12s %12s %12s   %-40s\n", "store", "B/rec 1KiB", "B/rec 16KiB", "1KiB+body", "purge per 1M expired: wall, client CPU, server CPU")
	for _, name := range stores {
		mk, ok := open[name]
		if !ok {
			t.Fatalf("IDEM_CAPACITY_STORES: unknown store %q", name)
		}
		t.Run(name, func(t *testing.T) { measure(t, name, mk(t), n, m) })
	}
}

func measure(t *testing.T, name string, b backend, n, m int) {
	ctx := t.Context()
	open := b.open
	if open == nil {
		open = func() (idemstore.Store, func() error, error) {
			return storeurl.Open(ctx, b.url, storeurl.Options{Migrate: true})
		}
	}
	s, closeStore, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()

	shapes := []shape{
		{answerSize: 1 << 10, retention: 24 * time.Hour},
		{answerSize: 16 << 10, retention: 24 * time.Hour},
		{answerSize: 1 << 10, storeBody: true, retention: 24 * time.Hour},
	}
	prev, prevCompact, err := b.size(ctx)
	if err != nil {
		t.Fatal(err)
	}
	per := make([]string, len(shapes))
	compact := make([]string, len(shapes))
	for i, sh := range shapes {
		start := time.Now()
		if err := load(ctx, s, n, workers, sh); err != nil {
			t.Fatalf("loading %d records of %d-byte answers: %v", n, sh.answerSize, err)
		}
		rate := float64(n) / time.Since(start).Seconds()
		now, nowCompact, err := b.size(ctx)
		if err != nil {
			t.Fatal(err)
		}
		per[i] = fmt.Sprintf("%.0f", float64(now-prev)/float64(n))
		compact[i] = fmt.Sprintf("%.0f", float64(nowCompact-prevCompact)/float64(n))
		t.Logf("%s: %d records with %d-byte answers (request body stored: %t): %d -> %d bytes; loaded at %.0f pairs/s",
			name, n, sh.answerSize, sh.storeBody, prev, now, rate)
		prev, prevCompact = now, nowCompact
		if nowCompact >= 0 {
			// The compacted size is the base of the next shape's growth.
			prev = nowCompact
		}
	}

	expired := shape{answerSize: 1 << 10}
	if b.expire != nil {
		expired.retention = time.Hour
	}
	if err := load(ctx, s, m, workers, expired); err != nil {
		t.Fatalf("loading %d expired records: %v", m, err)
	}
	if b.expire != nil {
		b.expire()
	}
	pctx, cancel := context.WithTimeout(ctx, purgeTimeout)
	defer cancel()
	srv := proccpu.Start(b.server)
	cpu0 := proccpu.Self()
	start := time.Now()
	deleted, err := s.Purge(pctx, idemstore.PurgeParams{BatchSize: 500})
	wall := time.Since(start)
	client := proccpu.Self() - cpu0
	server := srv.Elapsed()
	note := ""
	switch {
	case errors.Is(err, context.DeadlineExceeded) && deleted > 0 && ctx.Err() == nil:
		// Scaled from what was purged in time.
		note = fmt.Sprintf(", STOPPED after %s: %d of %d", purgeTimeout, deleted, m)
	case err != nil:
		t.Fatalf("purge, after %d records: %v", deleted, err)
	case deleted != m:
		t.Fatalf("purge deleted %d records, want the %d that expired", deleted, m)
	}
	scale := 1e6 / float64(deleted)
	srvText := "-"
	if b.server != nil {
		srvText = fmt.Sprintf("%.1fs", server.Seconds()*scale)
	}
	fmt.Printf("%-9s %12s %12s %12s   %.1fs, %.1fs, %s (%d purged in %.2fs%s)\n", name, per[0], per[1], per[2],
		wall.Seconds()*scale, client.Seconds()*scale, srvText, deleted, wall.Seconds(), note)
	if prevCompact >= 0 {
		fmt.Printf("%-9s %12s %12s %12s   (after VACUUM FULL: without free space)\n", name+"*", compact[0], compact[1], compact[2])
	}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// heapBytes returns the live heap after a full collection.
func heapBytes() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// memoryBackend measures a memory store without its caps (by default
// 100,000 records and 256 MiB, past which it evicts), on a clock that
// stands still until expire moves it.
func memoryBackend(*testing.T) backend {
	clock := testenv.NewClock(time.Now())
	return backend{
		url: "memory://",
		open: func() (idemstore.Store, func() error, error) {
			s, err := idemmem.New(idemmem.Config{MaxRecords: -1, MaxBytes: -1, Now: clock.Now})
			if err != nil {
				return nil, nil, err
			}
			return s, s.Close, nil
		},
		size:   func(context.Context) (int64, int64, error) { return heapBytes(), -1, nil },
		expire: func() { clock.Advance(2 * time.Hour) },
	}
}

func sqliteBackend(t *testing.T) backend {
	path := filepath.Join(t.TempDir(), "capacity.db")
	var db *sql.DB
	t.Cleanup(func() {
		if db != nil {
			db.Close()
		}
	})
	return backend{
		url: "sqlite://" + path,
		// Pages in use (not on the free list), after a checkpoint has
		// moved the WAL into the database file.
		size: func(ctx context.Context) (int64, int64, error) {
			if db == nil {
				var err error
				if db, err = idemsqlite.Open(path, idemsqlite.OpenOptions{}); err != nil {
					return 0, 0, err
				}
			}
			var busy, logged, moved, pages, free, pageSize int64
			if err := db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &logged, &moved); err != nil {
				return 0, 0, err
			}
			if busy != 0 {
				return 0, 0, fmt.Errorf("sqlite: checkpoint blocked")
			}
			for q, v := range map[string]*int64{"PRAGMA page_count": &pages, "PRAGMA freelist_count": &free, "PRAGMA page_size": &pageSize} {
				if err := db.QueryRowContext(ctx, q).Scan(v); err != nil {
					return 0, 0, err
				}
			}
			return (pages - free) * pageSize, -1, nil
		},
	}
}

func postgresBackend(t *testing.T) backend {
	base := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	schema := fmt.Sprintf("idem_capacity_%d", os.Getpid())
	conn, err := pgx.Connect(t.Context(), base)
	if err != nil {
		t.Fatal(err)
	}
	drop := func() {
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	}
	drop()
	t.Cleanup(func() { drop(); conn.Close(context.Background()) })
	total := func(ctx context.Context) (int64, error) {
		var n int64
		err := conn.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
			FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
			WHERE ns.nspname = $1 AND c.relkind IN ('r', 'p', 'm')`, schema).Scan(&n)
		return n, err
	}
	vacuum := func(ctx context.Context, how string) error {
		rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
			WHERE ns.nspname = $1 AND c.relkind = 'r'`, schema)
		if err != nil {
			return err
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, tb := range tables {
			if _, err := conn.Exec(ctx, "VACUUM "+how+pgx.Identifier{schema, tb}.Sanitize()); err != nil {
				return err
			}
		}
		return nil
	}
	return backend{
		url: testenv.WithParam(base, "schema", schema),
		// Every table of the schema with its indexes and TOAST, after a
		// VACUUM; then after a VACUUM FULL, which rewrites them compactly.
		size: func(ctx context.Context) (int64, int64, error) {
			if err := vacuum(ctx, ""); err != nil {
				return 0, 0, err
			}
			n, err := total(ctx)
			if err != nil {
				return 0, 0, err
			}
			if err := vacuum(ctx, "FULL "); err != nil {
				return 0, 0, err
			}
			c, err := total(ctx)
			return n, c, err
		},
		server: func() []int { return proccpu.Named("postgres") },
	}
}

var dbName = regexp.MustCompile(`\)/[^?]*`)

func mysqlBackend(t *testing.T) backend {
	dsn := testenv.Getenv(t, "IDEM_TEST_MYSQL_DSN")
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("idem_capacity_%d", os.Getpid())
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	drop := func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	}
	drop()
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drop(); admin.Close() })
	own := dbName.ReplaceAllString(dsn, ")/"+name)
	return backend{
		url: "mysql://" + testenv.WithParam(own, "interpolateParams", "true"),
		// data_length + index_length of every table, after ANALYZE TABLE
		// has counted their pages.
		size: func(ctx context.Context) (int64, int64, error) {
			rows, err := admin.QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", name)
			if err != nil {
				return 0, 0, err
			}
			var tables []string
			for rows.Next() {
				var tb string
				if err := rows.Scan(&tb); err != nil {
					rows.Close()
					return 0, 0, err
				}
				tables = append(tables, tb)
			}
			rows.Close()
			for _, tb := range tables {
				// ANALYZE TABLE answers with a result set; drain it.
				r, err := admin.QueryContext(ctx, fmt.Sprintf("ANALYZE TABLE `%s`.`%s`", name, tb))
				if err != nil {
					return 0, 0, err
				}
				for r.Next() {
				}
				r.Close()
			}
			var n int64
			err = admin.QueryRowContext(ctx, `SELECT coalesce(sum(data_length + index_length), 0)
				FROM information_schema.tables WHERE table_schema = ?`, name).Scan(&n)
			return n, -1, err
		},
		server: func() []int { return proccpu.Named("mariadbd", "mysqld") },
	}
}

func redisBackend(t *testing.T) backend {
	u := os.Getenv("IDEM_CAPACITY_REDIS_URL")
	if u == "" {
		t.Skip("IDEM_CAPACITY_REDIS_URL is not set: Redis needs a redis-server of its own, whose used_memory counts no other keys (scripts/bench-capacity.sh starts one)")
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	prefix := fmt.Sprintf("cap%d", os.Getpid())
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
		c.Close()
	})
	info := func(ctx context.Context, section, field string) (int64, error) {
		s, err := c.Info(ctx, section).Result()
		if err != nil {
			return 0, err
		}
		for line := range strings.Lines(s) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("redis: no %s in INFO %s", field, section)
	}
	pid, err := info(t.Context(), "server", "process_id")
	if err != nil {
		t.Fatal(err)
	}
	return backend{
		url: testenv.WithParam(u, "prefix", prefix),
		size: func(ctx context.Context) (int64, int64, error) {
			n, err := info(ctx, "memory", "used_memory")
			return n, -1, err
		},
		server: func() []int { return []int{int(pid)} },
	}
}
