package storeurl

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemredis"
)

// redis:// and redis+cluster:// URLs are read by go-redis's parsers (every
// parameter they know is accepted, and a typo is an error), and the store
// talks to Redis through rueidis (see idemredis). redisConn holds the
// settings of both kinds of URL that rueidis has a use for; the pool
// parameters have no counterpart, and neither have read_only,
// route_by_latency and route_randomly: the store reads from masters only.
type redisConn struct {
	network, user, password, clientName    string
	addrs                                  []string
	db, protocol, maxRetries               int
	tlsConfig                              *tls.Config
	dialTimeout, readTimeout, writeTimeout time.Duration
}

// redisClient connects to the Redis that t names and returns the client
// and the store's Config.
func (t *Target) redisClient() (rueidis.Client, idemredis.Config, error) {
	opt, cfg := t.redisOption()
	client, err := rueidis.NewClient(opt)
	return client, cfg, err
}

// redisOption returns the client option and the store's Config that t
// names.
func (t *Target) redisOption() (rueidis.ClientOption, idemredis.Config) {
	opt, cfg := t.redisConn().option(t.Kind == KindRedis)
	cfg.Prefix, cfg.MaxmemoryPolicy, cfg.Logger = t.redisPfx, t.redisPolicy, t.logger
	return opt, cfg
}

// redisConn collects the settings of t's go-redis options.
func (t *Target) redisConn() redisConn {
	if o := t.redis; o != nil {
		return redisConn{o.Network, o.Username, o.Password, o.ClientName, []string{o.Addr}, o.DB, o.Protocol, o.MaxRetries,
			o.TLSConfig, o.DialTimeout, o.ReadTimeout, o.WriteTimeout}
	}
	o := t.cluster
	return redisConn{"tcp", o.Username, o.Password, o.ClientName, o.Addrs, 0, o.Protocol, o.MaxRetries,
		o.TLSConfig, o.DialTimeout, o.ReadTimeout, o.WriteTimeout}
}

// option maps c to a rueidis.ClientOption and the store's Config.
//
//   - A redis:// URL names one node (ForceSingleClient), as it did for
//     go-redis; redis+cluster:// lists Cluster seeds.
//   - dial_timeout is the dialer's timeout; the larger of read_timeout and
//     write_timeout bounds how long a connection waits for replies
//     (ConnWriteTimeout). Zero and negative ones leave rueidis's defaults.
//   - max_retries, go-redis's resends (3 when absent or 0, none at -1),
//     becomes the store's Config.Resends and bounds rueidis's own retries of
//     read-only commands, so that listings fail instead of retrying while
//     Redis is down; the backoff is go-redis's, 8ms doubling to 512ms.
//   - protocol=2 speaks RESP2. Client-side caching, which the store never
//     uses, is off, so servers without RESP3 work too.
//   - A busy pipeline waits up to 20µs after each write for more scripts
//     to send with the next (MaxFlushDelay), which halves the client's
//     system calls under load; a lone request never waits.
func (c redisConn) option(single bool) (rueidis.ClientOption, idemredis.Config) {
	opt := rueidis.ClientOption{
		InitAddress:       c.addrs,
		Username:          c.user,
		Password:          c.password,
		ClientName:        c.clientName,
		SelectDB:          c.db,
		TLSConfig:         c.tlsConfig,
		AlwaysRESP2:       c.protocol == 2,
		DisableCache:      true,
		ForceSingleClient: single,
		MaxFlushDelay:     20 * time.Microsecond,
	}
	opt.Dialer.Timeout = max(c.dialTimeout, 0)
	opt.ConnWriteTimeout = max(c.readTimeout, c.writeTimeout, 0)
	if c.network == "unix" {
		opt.DialCtxFn = func(ctx context.Context, path string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
	}
	retries := c.maxRetries
	switch {
	case retries == 0:
		retries = 3 // go-redis's default
	case retries < 0:
		retries = -1
		opt.DisableRetry = true
	}
	opt.RetryDelay = func(attempt int, _ rueidis.Completed, _ error) time.Duration {
		if attempt > retries {
			return -1
		}
		return min(8*time.Millisecond<<min(attempt-1, 6), 512*time.Millisecond)
	}
	return opt, idemredis.Config{Resends: retries}
}
