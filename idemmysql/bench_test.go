package idemmysql_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/tools/storebench"
)

// benchWorkers are the numbers of concurrent callers: one (a lone request,
// which batching must not slow down), and 16 to 50 (bench/run.sh runs
// mysqlslap at the same concurrency).
var benchWorkers = []int{1, 16, 32, 50}

// BenchmarkReserveComplete measures the store's hot path, a Reserve of a
// fresh key then its Complete, from 1 to 50 goroutines, with group commit
// on (the default) and off, against the same INSERT and UPDATE sent
// through database/sql directly, one pair of autocommit statements at a
// time (raw), in the same run and on the same table. One op is one pair;
// it reports pairs/s, the p50 and p99 of a pair, and calls/batch, the mean
// number of calls each transaction carried.
func BenchmarkReserveComplete(b *testing.B) {
	db, _ := newDatabase(b, "")
	db.SetMaxOpenConns(benchWorkers[len(benchWorkers)-1])
	db.SetMaxIdleConns(benchWorkers[len(benchWorkers)-1])
	for _, mode := range batchModes {
		for _, n := range benchWorkers {
			b.Run(fmt.Sprintf("%s/c=%d", mode.name, n), func(b *testing.B) {
				s, err := idemmysql.New(db, mode.cfg)
				if err != nil {
					b.Fatal(err)
				}
				storebench.Run(b, n, s.Batcher(), storebench.StorePair(s))
			})
		}
	}
	// The statements the store sends alone, verbatim.
	const (
		now         = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"
		insertSQL   = "INSERT INTO idem_records (scope, operation, `key`, fingerprint, state, token, lease_until, reason, request, created_at, updated_at) VALUES (?, ?, ?, ?, 'pending', ?, (" + now + " + ?), '', ?, " + now + ", " + now + ")"
		completeSQL = "UPDATE idem_records SET state = 'completed', response = ?, expires_at = (" + now + " + ?), updated_at = " + now + " WHERE scope = ? AND operation = ? AND `key` = ? AND state = 'pending' AND token = ?"
	)
	for _, n := range benchWorkers[1:] {
		b.Run(fmt.Sprintf("raw/c=%d", n), func(b *testing.B) {
			storebench.Run(b, n, nil, func(ctx context.Context, k idemstore.Key, tok string) error {
				if _, err := db.ExecContext(ctx, insertSQL, k.Scope, k.Operation, k.Key, "fp", tok, int64(30000), nil); err != nil {
					return err
				}
				res, err := db.ExecContext(ctx, completeSQL, idemstore.EncodeResponse(storebench.Response), int64(24*time.Hour/time.Millisecond), k.Scope, k.Operation, k.Key, tok)
				if err == nil {
					_, err = res.RowsAffected()
				}
				return err
			})
		})
	}
}
