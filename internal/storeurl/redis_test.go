package storeurl

import (
	"testing"
	"time"

	"github.com/redis/rueidis"
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
