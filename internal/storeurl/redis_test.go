package storeurl

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestRedisOption checks how a store URL's settings reach rueidis and the
// store, without connecting.
func TestRedisOption(t *testing.T) {
	t.Parallel()
	cases := []struct {
		url     string
		check   func(t *testing.T, o rueidis.ClientOption)
		resends int
		retries int // the last attempt rueidis's RetryDelay allows
	}{
		{"redis://u:pw@127.0.0.1:6379/3?dial_timeout=2s&read_timeout=4s&write_timeout=1s&client_name=idem&protocol=2", func(t *testing.T, o rueidis.ClientOption) {
			eq(t, len(o.InitAddress), 1)
			eq(t, o.InitAddress[0], "127.0.0.1:6379")
			eq(t, o.Username, "u")
			eq(t, o.Password, "pw")
			eq(t, o.SelectDB, 3)
			eq(t, o.Dialer.Timeout, 2*time.Second)
			eq(t, o.ConnWriteTimeout, 4*time.Second)
			eq(t, o.ClientName, "idem")
			eq(t, o.AlwaysRESP2, true)
			eq(t, o.ForceSingleClient, true)
			eq(t, o.DisableCache, true)
			eq(t, o.MaxFlushDelay, 20*time.Microsecond)
			eq(t, o.DisableRetry, false)
			eq(t, o.TLSConfig == nil, true)
			eq(t, o.DialCtxFn == nil, true)
		}, 3, 3},
		{"rediss://:pw@h:6380/0?max_retries=5", func(t *testing.T, o rueidis.ClientOption) {
			eq(t, o.TLSConfig != nil && o.TLSConfig.ServerName == "h", true)
			eq(t, o.AlwaysRESP2, false)
		}, 5, 5},
		{"redis://127.0.0.1:6379/0?max_retries=-1", func(t *testing.T, o rueidis.ClientOption) {
			eq(t, o.DisableRetry, true)
		}, -1, 0},
		{"unix:///run/redis.sock?db=2", func(t *testing.T, o rueidis.ClientOption) {
			eq(t, o.InitAddress[0], "/run/redis.sock")
			eq(t, o.SelectDB, 2)
			eq(t, o.DialCtxFn != nil, true)
		}, 3, 3},
		{"redis+cluster://u:pw@h1:7000,h2:7001?dial_timeout=3s&write_timeout=5s&max_retries=1", func(t *testing.T, o rueidis.ClientOption) {
			eq(t, len(o.InitAddress), 2)
			eq(t, o.InitAddress[1], "h2:7001")
			eq(t, o.Username, "u")
			eq(t, o.Password, "pw")
			eq(t, o.Dialer.Timeout, 3*time.Second)
			eq(t, o.ConnWriteTimeout, 5*time.Second)
			eq(t, o.ForceSingleClient, false)
			eq(t, o.SelectDB, 0)
		}, 1, 1},
		{"rediss+cluster://h1:7000", func(t *testing.T, o rueidis.ClientOption) {
			eq(t, o.TLSConfig != nil, true)
		}, 3, 3},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			t.Parallel()
			tg, err := Parse(c.url)
			if err != nil {
				t.Fatal(err)
			}
			opt, cfg := tg.redisConn().option(tg.Kind == KindRedis)
			c.check(t, opt)
			eq(t, cfg.Resends, c.resends)
			var cmd rueidis.Completed
			for attempt := 1; attempt <= c.retries+1; attempt++ {
				d := opt.RetryDelay(attempt, cmd, nil)
				if want := attempt <= c.retries; (d >= 0) != want || d > 512*time.Millisecond {
					t.Errorf("RetryDelay(%d) = %v; retry wanted: %v", attempt, d, want)
				}
			}
		})
	}
}

// TestRedisPolicyParam checks maxmemory_policy, which states a Redis
// server's policy where CONFIG GET is refused: it reaches the store's
// Config, go-redis never sees it, and an empty or unknown value (or a
// prefix the store would refuse) fails at Parse rather than at every
// connection attempt.
func TestRedisPolicyParam(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, policy, prefix string }{
		{"redis://127.0.0.1:6379/0?maxmemory_policy=noeviction&prefix=p", "noeviction", "p"},
		{"rediss://:pw@h:6380/1?maxmemory_policy=NoEviction&dial_timeout=2s", "NoEviction", ""},
		{"redis+cluster://h1:7000,h2:7001?maxmemory_policy=noeviction&prefix=q&dial_timeout=2s", "noeviction", "q"},
		{"redis://127.0.0.1:6379/0", "", ""},
	} {
		tg, err := Parse(c.url)
		if err != nil {
			t.Fatalf("Parse(%s): %v", c.url, err)
		}
		_, cfg := tg.redisOption()
		eq(t, cfg.MaxmemoryPolicy, c.policy)
		eq(t, cfg.Prefix, c.prefix)
	}
	for _, c := range []struct{ url, wantErr string }{
		{"redis://127.0.0.1:6379/0?maxmemory_policy=", "maxmemory_policy must not be empty"},
		{"redis+cluster://h1:7000?maxmemory_policy=", "maxmemory_policy must not be empty"},
		{"redis://127.0.0.1:6379/0?maxmemory_policy=no-eviction", "is not a Redis maxmemory-policy"},
		{"redis+cluster://h1:7000?maxmemory_policy=lru", "is not a Redis maxmemory-policy"},
		{"redis://127.0.0.1:6379/0?prefix=a%7Bb", "must not contain"},
	} {
		if _, err := Parse(c.url); err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("Parse(%s) = %v, want an error with %q", c.url, err, c.wantErr)
		}
	}
}

// TestOpenRedisPolicyLogged opens the test server (noeviction, CONFIG
// allowed) with a stated policy that differs: the server's answer counts,
// and the store's warning reaches Options.Logger.
func TestOpenRedisPolicyLogged(t *testing.T) {
	t.Parallel()
	u := testenv.WithParam(testenv.Getenv(t, "IDEM_TEST_REDIS_URL"), "maxmemory_policy", "volatile-lru")
	var logs testenv.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, closeFn, err := Open(ctx, u, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "stated=volatile-lru") || !strings.Contains(out, "reported=noeviction") {
		t.Fatalf("no warning on Options.Logger: %q", out)
	}
}
