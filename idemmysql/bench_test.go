package idemmysql_test

import (
	"context"
	"crypto/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
)

// benchWorkers is the number of concurrent callers.
const benchWorkers = 16

var benchResp = &idemstore.Response{Status: 201, Body: []byte(`{"id":"ord_123","status":"paid"}`)}

// BenchmarkReserveComplete measures the store's hot path, a Reserve of a
// fresh key then its Complete, from 16 goroutines (store), against the same
// INSERT and UPDATE sent through database/sql directly (raw), in the same
// run and on the same table. One op is one pair; compare the pairs/s.
func BenchmarkReserveComplete(b *testing.B) {
	db, _ := newDatabase(b, "")
	db.SetMaxOpenConns(benchWorkers)
	db.SetMaxIdleConns(benchWorkers)
	s, err := idemmysql.New(db, idemmysql.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("store", func(b *testing.B) {
		runPairs(b, func(ctx context.Context, k idemstore.Key, tok string, now time.Time) error {
			if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, LeaseUntil: now.Add(30 * time.Second), Now: now}); err != nil {
				return err
			}
			return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: benchResp, Now: now, ExpiresAt: now.Add(24 * time.Hour)})
		})
	})
	// The statements the store sends, verbatim.
	const (
		insertSQL   = "INSERT INTO idem_records (scope, operation, `key`, fingerprint, state, token, lease_until, reason, created_at) VALUES (?, ?, ?, ?, 'pending', ?, ?, '', ?)"
		completeSQL = "UPDATE idem_records SET state = 'completed', response = ?, expires_at = ? WHERE scope = ? AND operation = ? AND `key` = ? AND state = 'pending' AND token = ?"
	)
	b.Run("raw", func(b *testing.B) {
		runPairs(b, func(ctx context.Context, k idemstore.Key, tok string, now time.Time) error {
			if _, err := db.ExecContext(ctx, insertSQL, k.Scope, k.Operation, k.Key, "fp", tok, now.Add(30*time.Second).UnixMilli(), now.UnixMilli()); err != nil {
				return err
			}
			res, err := db.ExecContext(ctx, completeSQL, idemstore.EncodeResponse(benchResp), now.Add(24*time.Hour).UnixMilli(), k.Scope, k.Operation, k.Key, tok)
			if err == nil {
				_, err = res.RowsAffected()
			}
			return err
		})
	})
}

// runPairs runs b.N pairs on benchWorkers goroutines, each pair on a fresh
// key, and reports pairs/s.
func runPairs(b *testing.B, pair func(ctx context.Context, k idemstore.Key, tok string, now time.Time) error) {
	ctx := b.Context()
	var next atomic.Int64
	var failed atomic.Pointer[error]
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range benchWorkers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				// Random keys, as clients send (and as mysqlslap.sql does).
				k := idemstore.Key{Scope: "bench", Operation: "POST /orders", Key: rand.Text()}
				if err := pair(ctx, k, "tok-"+k.Key, time.Now()); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}
