package capacity

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/internal/proccpu"
	"github.com/idem-dev/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/tools/storebench"
)

// BenchmarkStorePairs runs reserve+complete pairs on fresh keys, as
// BenchmarkReserveComplete does in the store packages, on the store that
// IDEM_CAPACITY_STORE_URL names (a storeurl URL), from 16 and 50
// goroutines. Besides pairs/s and the p50 and p99 of a pair it reports
// server-µs/pair: the CPU time of the store's server processes per pair
// (PostgreSQL: every postgres process; MySQL: every mariadbd or mysqld; a
// Redis URL: the redis-server of every host the URL lists, so a Cluster URL
// must list every master). scripts/bench-capacity.sh runs it on Redis
// Clusters of 1, 2 and 3 masters.
func BenchmarkStorePairs(b *testing.B) {
	u := os.Getenv("IDEM_CAPACITY_STORE_URL")
	if u == "" {
		b.Skip("set IDEM_CAPACITY_STORE_URL to a store URL (scripts/bench-capacity.sh)")
	}
	ctx := b.Context()
	s, closeStore, err := storeurl.Open(ctx, u, storeurl.Options{Migrate: true})
	if err != nil {
		b.Fatal(err)
	}
	defer closeStore()
	servers, err := serverPIDs(ctx, u)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []int{16, 50} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			cpu := proccpu.Start(servers)
			storebench.Run(b, c, nil, storebench.StorePair(s))
			if servers != nil {
				b.ReportMetric(float64(cpu.Elapsed().Microseconds())/float64(b.N), "server-µs/pair")
			}
		})
	}
}

// serverPIDs returns what lists the server processes of the store URL u,
// or nil for an in-process store.
func serverPIDs(ctx context.Context, u string) (func() []int, error) {
	scheme, rest, _ := strings.Cut(u, "://")
	switch scheme {
	case "postgres", "postgresql":
		return func() []int { return proccpu.Named("postgres") }, nil
	case "mysql":
		return func() []int { return proccpu.Named("mariadbd", "mysqld") }, nil
	case "redis", "redis+cluster":
	default:
		return nil, nil
	}
	hosts, _, _ := strings.Cut(rest, "?")
	hosts, _, _ = strings.Cut(hosts, "/")
	if _, h, ok := strings.Cut(hosts, "@"); ok {
		hosts = h
	}
	var pids []int
	for _, h := range strings.Split(hosts, ",") {
		c := redis.NewClient(&redis.Options{Addr: h})
		s, err := c.Info(ctx, "server").Result()
		c.Close()
		if err != nil {
			return nil, fmt.Errorf("INFO server of %s: %w", h, err)
		}
		var pid int
		for line := range strings.Lines(s) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
				fmt.Sscan(v, &pid)
			}
		}
		if pid == 0 {
			return nil, fmt.Errorf("INFO server of %s gives no process_id", h)
		}
		pids = append(pids, pid)
	}
	return func() []int { return pids }, nil
}
