package storeurl

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url     string
		kind    Kind
		wantErr string // substring; empty means success
		check   func(t *testing.T, tg *Target)
	}{
		{url: "sqlite://idem.db", kind: KindSQLite, check: func(t *testing.T, tg *Target) {
			eq(t, tg.sqlitePath, "idem.db")
			eq(t, string(tg.sqliteOpts.Synchronous), string(idemsqlite.SynchronousFull)) // durable by default
		}},
		{url: "sqlite://idem.db?synchronous=normal", kind: KindSQLite, check: func(t *testing.T, tg *Target) {
			eq(t, string(tg.sqliteOpts.Synchronous), string(idemsqlite.SynchronousNormal))
		}},
		{url: "sqlite://./data/idem.db", kind: KindSQLite, check: func(t *testing.T, tg *Target) { eq(t, tg.sqlitePath, "./data/idem.db") }},
		{url: "sqlite:///var/lib/idem/idem.db", kind: KindSQLite, check: func(t *testing.T, tg *Target) { eq(t, tg.sqlitePath, "/var/lib/idem/idem.db") }},
		{url: "sqlite://x.db?synchronous=full&busy_timeout=2s&max_open_conns=4", kind: KindSQLite, check: func(t *testing.T, tg *Target) {
			eq(t, string(tg.sqliteOpts.Synchronous), string(idemsqlite.SynchronousFull))
			eq(t, tg.sqliteOpts.BusyTimeout.String(), "2s")
			eq(t, tg.sqliteOpts.MaxOpenConns, 4)
		}},
		{url: "sqlite://", wantErr: "needs a file path"},
		{url: "sqlite://x.db?synchronous=off", wantErr: "synchronous must be"},
		{url: "sqlite://x.db?journal=wal", wantErr: `unknown sqlite parameter "journal"`},
		{url: "memory://", kind: KindMemory},
		{url: "memory://x", wantErr: "takes only parameters"},
		{url: "memory://?max_records=5000&max_bytes=64MiB", kind: KindMemory, check: func(t *testing.T, tg *Target) {
			eq(t, tg.mem.MaxRecords, 5000)
			eq(t, tg.mem.MaxBytes, int64(64<<20))
		}},
		{url: "memory://?max_records=unlimited&max_bytes=Unlimited", kind: KindMemory, check: func(t *testing.T, tg *Target) {
			eq(t, tg.mem.MaxRecords, -1)
			eq(t, tg.mem.MaxBytes, int64(-1))
		}},
		{url: "memory://?max_bytes=1000000", kind: KindMemory, check: func(t *testing.T, tg *Target) {
			eq(t, tg.mem.MaxRecords, 0) // idemmem's default
			eq(t, tg.mem.MaxBytes, int64(1000000))
		}},
		{url: "memory://?max_records=0", wantErr: "max_records must be a positive whole number"},
		{url: "memory://?max_records=-5", wantErr: "max_records must be a positive whole number"},
		{url: "memory://?max_records=1e6", wantErr: "max_records must be a positive whole number"},
		{url: "memory://?max_records=99999999999", wantErr: "max_records must be a positive whole number"},
		{url: "memory://?max_bytes=10", wantErr: "too small to hold a few records"},
		{url: "memory://?max_bytes=64MiBs", wantErr: `unknown unit "MiBs"`},
		{url: "memory://?max_bytes=", wantErr: "must be a whole number of bytes"},
		{url: "memory://?max_bytes=99999999999TiB", wantErr: "too large"},
		{url: "memory://?max_size=1", wantErr: `unknown memory parameter "max_size"`},
		{url: "postgres://u:secret@127.0.0.1:5432/idem?sslmode=disable", kind: KindPostgres, check: func(t *testing.T, tg *Target) {
			eq(t, tg.pg.ConnConfig.Host, "127.0.0.1")
			eq(t, tg.pg.ConnConfig.Database, "idem")
			eq(t, tg.pg.ConnConfig.Password, "secret")
		}},
		{url: "postgresql://127.0.0.1/x", kind: KindPostgres},
		{url: "postgres://u:secret@127.0.0.1/idem?sslmode=disable&schema=payments", kind: KindPostgres, check: func(t *testing.T, tg *Target) {
			eq(t, tg.pgSchema, "payments")
			eq(t, tg.pg.ConnConfig.Password, "secret")
			// pgx would send an unknown parameter to the server as a setting.
			if _, ok := tg.pg.ConnConfig.RuntimeParams["schema"]; ok {
				t.Errorf("schema reached pgx's runtime parameters: %v", tg.pg.ConnConfig.RuntimeParams)
			}
		}},
		{url: "postgres://127.0.0.1/x?schema=", wantErr: "schema must not be empty"},
		{url: "redis://127.0.0.1:6379/1?prefix=payments&dial_timeout=2s", kind: KindRedis, check: func(t *testing.T, tg *Target) {
			eq(t, tg.redisPfx, "payments")
			eq(t, tg.redis.DB, 1)
			eq(t, tg.redis.DialTimeout.String(), "2s")
		}},
		{url: "redis://127.0.0.1:6379/0?prefix=", wantErr: "prefix must not be empty"},
		{url: "redis+cluster://127.0.0.1:7000,127.0.0.1:7001?prefix=payments", kind: KindRedisCluster, check: func(t *testing.T, tg *Target) {
			eq(t, tg.redisPfx, "payments")
			eq(t, len(tg.cluster.Addrs), 2)
		}},
		{url: "postgres://u:secret@127.0.0.1:notaport/x", wantErr: "postgres"},
		{url: "mysql://u:p@ss@tcp(127.0.0.1:3306)/idem?timeout=2s", kind: KindMySQL, check: func(t *testing.T, tg *Target) {
			eq(t, tg.my.User, "u")
			eq(t, tg.my.Passwd, "p@ss")
			eq(t, tg.my.Addr, "127.0.0.1:3306")
			eq(t, tg.my.DBName, "idem")
			eq(t, tg.my.ParseTime, true)
			eq(t, tg.my.Timeout.String(), "2s")
			eq(t, tg.my.InterpolateParams, true)
		}},
		{url: "mysql://u:p@tcp(127.0.0.1:3306)/idem?interpolateParams=false", kind: KindMySQL, check: func(t *testing.T, tg *Target) {
			eq(t, tg.my.InterpolateParams, false)
		}},
		{url: "mysql://u:p?interpolateParams=true@tcp(127.0.0.1:3306)/idem?interpolateParams=false&timeout=2s", kind: KindMySQL, check: func(t *testing.T, tg *Target) {
			eq(t, tg.my.Passwd, "p?interpolateParams=true")
			eq(t, tg.my.InterpolateParams, false)
		}},
		// The driver refuses client-side escaping with a multi-byte
		// collation whose bytes can hide a quote: statements stay prepared.
		{url: "mysql://u:p@tcp(127.0.0.1:3306)/idem?collation=sjis_japanese_ci", kind: KindMySQL, check: func(t *testing.T, tg *Target) {
			eq(t, tg.my.InterpolateParams, false)
		}},
		// Nor with a charset whose bytes can hide a backslash, named as
		// the charset or as a session variable; a UTF-8 one keeps it.
		{url: "mysql://u:p@tcp(127.0.0.1:3306)/idem?charset=gbk", kind: KindMySQL, check: func(t *testing.T, tg *Target) {
			eq(t, tg.my.InterpolateParams, false)
		}},
		{url: "mysql://u:p@tcp(127.0.0.1:3306)/idem?charset=utf8mb4,sjis", kind: KindMySQL, check: func(t *testing.T, tg *Target) {
			eq(t, tg.my.InterpolateParams, false)
		}},
		{url: "mysql://u:p@tcp(127.0.0.1:3306)/idem?character_set_client=big5", kind: KindMySQL, check: func(t *testing.T, tg *Target) {
			eq(t, tg.my.InterpolateParams, false)
		}},
		{url: "mysql://u:p@tcp(127.0.0.1:3306)/idem?charset=utf8mb4", kind: KindMySQL, check: func(t *testing.T, tg *Target) {
			eq(t, tg.my.InterpolateParams, true)
		}},
		{url: "mysql://u:p@tcp(127.0.0.1:3306)/", wantErr: "needs a database name"},
		{url: "mysql://", wantErr: "needs a DSN"},
		{url: "mysql://u:p@tcp(127.0.0.1:3306)/idem?timeout=soon", wantErr: "invalid duration"},
		{url: "redis://127.0.0.1:6379/2", kind: KindRedis, check: func(t *testing.T, tg *Target) {
			eq(t, tg.redis.Addr, "127.0.0.1:6379")
			eq(t, tg.redis.DB, 2)
		}},
		{url: "rediss://:pw@127.0.0.1:6380/0", kind: KindRedis, check: func(t *testing.T, tg *Target) {
			eq(t, tg.redis.Password, "pw")
			eq(t, tg.redis.TLSConfig != nil, true)
		}},
		{url: "redis://127.0.0.1:6379/x", wantErr: "invalid database number"},
		{url: "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002", kind: KindRedisCluster, check: func(t *testing.T, tg *Target) {
			eq(t, strings.Join(tg.cluster.Addrs, " "), "127.0.0.1:7000 127.0.0.1:7001 127.0.0.1:7002")
		}},
		{url: "redis+cluster://:pw@h1:7000,h2:7001?dial_timeout=3s", kind: KindRedisCluster, check: func(t *testing.T, tg *Target) {
			eq(t, tg.cluster.Password, "pw")
			eq(t, tg.cluster.DialTimeout.String(), "3s")
			eq(t, len(tg.cluster.Addrs), 2)
		}},
		{url: "redis+cluster://", wantErr: "at least one host:port"},
		{url: "redis+cluster://h1:7000,h2", wantErr: `"h2" is not host:port`},
		{url: "idem.db", wantErr: "has no scheme"},
		{url: "mongodb://x", wantErr: `unknown scheme "mongodb"`},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			t.Parallel()
			tg, err := Parse(tt.url)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) error = %v, want one containing %q", tt.url, err, tt.wantErr)
				}
				for _, secret := range []string{"secret", ":pw@", "p@ss"} {
					if strings.Contains(err.Error(), secret) {
						t.Fatalf("error %q leaks the password", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.url, err)
			}
			eq(t, tg.Kind, tt.kind)
			if tt.check != nil {
				tt.check(t, tg)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"postgres://u:secret@h:5432/db?sslmode=disable", "postgres://u:xxxxx@h:5432/db?sslmode=disable"},
		{"postgres://h/db?password=secret", "postgres://h/db?password=xxxxx"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"mysql://u:p@ss@tcp(h:3306)/db", "mysql://u:xxxxx@tcp(h:3306)/db"},
		{"redis://:pw@h:6379/0", "redis://:xxxxx@h:6379/0"},
		{"redis+cluster://u:pw@h1:1,h2:2", "redis+cluster://u:xxxxx@h1:1,h2:2"},
		{"sqlite:///var/lib/idem.db", "sqlite:///var/lib/idem.db"},
		{"memory://", "memory://"},
		{"u:pw@tcp(h)/db", "xxxxx@tcp(h)/db"},
	}
	for _, tt := range tests {
		if got := Redact(tt.in); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestOpenSQLiteAndMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, u := range []string{"sqlite://" + filepath.Join(t.TempDir(), "idem.db"), "memory://"} {
		s, closeFn, err := Open(ctx, u, Options{Migrate: true})
		if err != nil {
			t.Fatalf("Open(%q): %v", u, err)
		}
		key := idemstore.Key{Scope: "s", Operation: "POST /x", Key: "k"}
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key, Fingerprint: "f", Token: "t", Lease: time.Minute}); err != nil || !created {
			t.Fatalf("%s: Reserve = %v, %v", u, created, err)
		}
		if err := closeFn(); err != nil {
			t.Fatalf("%s: close: %v", u, err)
		}
	}
}

// memory://'s parameters reach the store: at max_records of pending
// records, a new key is refused as full.
func TestOpenMemoryBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, closeFn, err := Open(ctx, "memory://?max_records=2&max_bytes=1MiB", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	for i, want := range []error{nil, nil, idemstore.ErrFull} {
		key := idemstore.Key{Scope: "s", Operation: "POST /x", Key: strconv.Itoa(i)}
		_, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key, Fingerprint: "f", Token: "t", Lease: time.Minute})
		if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Fatalf("Reserve %d: %v, want %v", i, err, want)
		}
	}
}

func TestOpenUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, u := range []string{"postgres://u:secret@127.0.0.1:1/x?connect_timeout=2", "redis://:secret@127.0.0.1:1/0", "mysql://u:secret@tcp(127.0.0.1:1)/x"} {
		_, _, err := Open(ctx, u, Options{})
		if !errors.Is(err, idemstore.ErrUnavailable) {
			t.Errorf("Open(%q) error = %v, want ErrUnavailable", Redact(u), err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("error %q leaks the password", err)
		}
	}
}

func TestLazyUnreachableThenClose(t *testing.T) {
	t.Parallel()
	s, closeFn, err := Open(context.Background(), "redis://127.0.0.1:1/0", Options{Lazy: true, RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("lazy Open: %v", err)
	}
	_, err = s.Get(context.Background(), idemstore.Key{Scope: "s", Operation: "o", Key: "k"})
	if !errors.Is(err, idemstore.ErrUnavailable) {
		t.Fatalf("Get before connecting = %v, want ErrUnavailable", err)
	}
	if !s.Capabilities().Notify {
		t.Error("a Redis store should report Notify before it connects")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Get(ctx, idemstore.Key{Scope: "s", Operation: "o", Key: "k"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Get with a canceled context = %v, want context.Canceled", err)
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
}

func TestLazyConnects(t *testing.T) {
	t.Parallel()
	s, closeFn, err := Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), Options{Lazy: true, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	key := idemstore.Key{Scope: "s", Operation: "o", Key: "k"}
	for i := 0; ; i++ {
		_, err := s.Get(context.Background(), key)
		if errors.Is(err, idemstore.ErrNotFound) {
			break
		}
		if i == 500 {
			t.Fatalf("lazy SQLite store never became ready: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Its group commit counters come through the wrapper: the Get above
	// is not batched, a Reserve runs alone.
	if _, _, err := s.Reserve(context.Background(), idemstore.ReserveParams{Key: key, Fingerprint: "f", Token: "t", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	st, ok := s.(idemstore.BatchReporter).BatchStats()
	if !ok || st != (idemstore.BatchStats{Alone: 1}) {
		t.Fatalf("BatchStats() = %+v, %v; want one call alone", st, ok)
	}
}

// TestLazyBatchStatsBeforeConnecting: a lazy store that has not connected
// reports no batching rather than zeros, and so does a store that does not
// batch.
func TestLazyBatchStatsBeforeConnecting(t *testing.T) {
	t.Parallel()
	var l lazy // never connected
	if st, ok := l.BatchStats(); ok {
		t.Fatalf("BatchStats() before connecting = %+v, true", st)
	}
	var mem idemstore.Store
	mem, closeFn, err := Open(context.Background(), "memory://", Options{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if st, ok := mem.(idemstore.BatchReporter).BatchStats(); ok {
		t.Fatalf("memory:// BatchStats() = %+v, true", st)
	}
}

func eq[T comparable](t *testing.T, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want int64
		err  string
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "512B", want: 512},
		{in: "64MiB", want: 64 << 20},
		{in: "64 mib", want: 64 << 20},
		{in: "2GB", want: 2e9},
		{in: "1kb", want: 1000},
		{in: "3KiB", want: 3072},
		{in: "1TiB", want: 1 << 40},
		{in: "", err: "whole number"},
		{in: "MiB", err: "whole number"},
		{in: "-1MiB", err: "whole number"},
		{in: "1.5GiB", err: "unknown unit"},
		{in: "12 parsecs", err: "unknown unit"},
		{in: "9223372036854775808", err: "too large"},
		{in: "8388608TiB", err: "too large"},
	} {
		got, err := ParseSize(c.in)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParseSize(%q) = %d, %v; want an error with %q", c.in, got, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
}

// TestCapabilitiesAreTheStores: what a URL says its store can do, before
// connecting, is what the store reports once open, searching included,
// and a lazy store searches and counts through its wrapper.
func TestCapabilitiesAreTheStores(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"memory://", "sqlite://" + filepath.Join(t.TempDir(), "idem.db")} {
		tg, err := Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		s, closeFn, err := Open(context.Background(), u, Options{Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := tg.Capabilities(), s.Capabilities(); got != want {
			t.Errorf("%s: the URL says %+v, the store %+v", tg.Kind, got, want)
		}
		closeFn()
	}
	for _, u := range []string{"postgres://u@h/db", "mysql://u:p@tcp(h:3306)/db", "redis://h:6379/0", "redis+cluster://h1:1,h2:2"} {
		if tg, err := Parse(u); err != nil || !tg.Capabilities().Search {
			t.Errorf("%s: %v; want Search", u, err)
		}
	}

	s, closeFn, err := Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "lazy.db"), Options{Lazy: true, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	key := idemstore.Key{Scope: "s", Operation: "o", Key: "order-1001"}
	// A local SQLite file connects before Open returns.
	if _, _, err := s.Reserve(context.Background(), idemstore.ReserveParams{Key: key, Fingerprint: "f", Token: "t", Lease: time.Minute, ScopeLabel: "acct_1"}); err != nil {
		t.Fatal(err)
	}
	if !s.Capabilities().Search {
		t.Fatal("a lazy SQLite store does not report Search")
	}
	page, err := s.List(context.Background(), idemstore.ListParams{Key: "order-1001", ScopeLabels: []string{"acct_1"}})
	if err != nil || len(page.Records) != 1 {
		t.Fatalf("a search through the lazy store: %d records, %v", len(page.Records), err)
	}
	c, ok := s.(idemstore.Counter)
	if !ok {
		t.Fatal("a lazy store does not count")
	}
	if n, err := c.Counts(context.Background()); err != nil || n.Pending != 1 {
		t.Fatalf("Counts = %+v, %v", n, err)
	}
}
