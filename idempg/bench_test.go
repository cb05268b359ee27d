package idempg_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/internal/tools/storebench"
)

// benchWorkers are the numbers of concurrent callers: one (a lone
// request, which batching must not slow down), and 16 to 50 (bench/run.sh
// runs pgbench at the same client counts).
var benchWorkers = []int{1, 16, 32, 50}

// BenchmarkReserveComplete measures the store's hot path: reserve a fresh
// key, then complete it with a small answer, from 1 to 50 goroutines at
// once, with group commit on (the default) and off. One op is one
// Reserve+Complete pair; it reports pairs/s (what bench/run.sh compares
// with pgbench running the same two statements), the p50 and p99 of a
// pair, and calls/batch, the mean number of calls each transaction carried.
//
// The notify=off variant shows what Config.DisableNotify buys: PostgreSQL
// serialises the commits of transactions that NOTIFY.
func BenchmarkReserveComplete(b *testing.B) {
	for _, mode := range batchModes {
		for _, n := range benchWorkers {
			b.Run(fmt.Sprintf("%s/c=%d", mode.name, n), func(b *testing.B) { benchReserveComplete(b, mode.cfg, n) })
		}
	}
	b.Run("notify=off/c=16", func(b *testing.B) { benchReserveComplete(b, idempg.Config{DisableNotify: true}, 16) })
	b.Run("notify=off/c=50", func(b *testing.B) { benchReserveComplete(b, idempg.Config{DisableNotify: true}, 50) })
}

func benchReserveComplete(b *testing.B, cfg idempg.Config, workers int) {
	pool := testPool(b, "")
	if int(pool.Config().MaxConns) < workers {
		pool = benchPool(b, workers)
	}
	s := newStore(b, pool, cfg)
	storebench.Run(b, workers, s.Batcher(), storebench.StorePair(s))
}

// benchPool returns a pool of n connections to the test server, closed
// when the benchmark ends, so that n callers without batching each have a
// connection, as pgbench's n clients do.
func benchPool(b *testing.B, n int) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(testURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(n)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}
