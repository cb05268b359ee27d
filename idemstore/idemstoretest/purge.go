package idemstoretest

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

func testPurge(t *testing.T, h Harness) {
	t.Run("Batches", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, h.New(t))
		n := 0
		next := func() idemstore.Key { n++; return f.key(fmt.Sprintf("k%03d", n)) }
		// completed reserves one key per retention, then completes each
		// with its retention. Reservations come first: a store may evict
		// expired records when it reserves, which would leave Purge less
		// to do.
		completed := func(retentions ...time.Duration) []idemstore.Key {
			recs := make([]*idemstore.Record, len(retentions))
			for i := range recs {
				recs[i] = f.reserve(next(), leaseLive)
			}
			keys := make([]idemstore.Key, len(recs))
			for i, rec := range recs {
				f.complete(rec, jsonResponse(fmt.Sprintf(`{"n":%d}`, i)), retentions[i])
				keys[i] = rec.Key
			}
			return keys
		}
		times := func(n int, d time.Duration) []time.Duration {
			out := make([]time.Duration, n)
			for i := range out {
				out[i] = d
			}
			return out
		}
		var kept []idemstore.Key
		for range 3 {
			kept = append(kept, f.reserve(next(), leaseExpired).Key) // pending, expired lease
		}
		for range 2 {
			rec := f.reserve(next(), leaseExpired)
			f.escalate(rec, "check")
			kept = append(kept, rec.Key)
		}
		kept = append(kept, completed(times(3, retainLive)...)...)
		// Retention zero ends as the record completes: purged too.
		doomed := completed(append(times(24, retainExpired), 0)...)
		keptBefore := make([]*idemstore.Record, len(kept))
		for i, k := range kept {
			keptBefore[i] = f.get(k)
		}

		purge := func(batch, want int) {
			t.Helper()
			var progress []int
			got, err := f.s.Purge(f.ctx(), idemstore.PurgeParams{BatchSize: batch,
				Progress: func(n int) { progress = append(progress, n) }})
			if err != nil {
				t.Fatalf("Purge(BatchSize %d): %v", batch, err)
			}
			if got != want {
				t.Fatalf("Purge(BatchSize %d) = %d, want %d", batch, got, want)
			}
			// Progress counts up to the total, one call per batch that
			// deleted records; a store may split batches finer.
			last := 0
			for _, n := range progress {
				if n <= last {
					t.Fatalf("Purge(BatchSize %d): Progress saw %v, not increasing", batch, progress)
				}
				last = n
			}
			if last != want {
				t.Fatalf("Purge(BatchSize %d) = %d, but Progress ended at %d (%v)", batch, got, last, progress)
			}
			if batch > 0 && want > batch && len(progress) < 2 {
				t.Fatalf("Purge(BatchSize %d) deleted %d records but reported progress %d time(s)", batch, want, len(progress))
			}
		}
		purge(7, len(doomed)) // 25 records, batches of 7: 7+7+7+4
		for _, k := range doomed {
			f.requireGone(k)
		}
		for _, r := range keptBefore {
			f.requireUnchanged(r, "Purge")
		}
		purge(7, 0)

		// An exact multiple of the batch size: 7+7, then an empty batch.
		completed(times(14, retainExpired)...)
		purge(7, 14)

		// The default batch size.
		completed(times(3, retainExpired)...)
		purge(0, 3)
		for _, r := range keptBefore {
			f.requireUnchanged(r, "Purge")
		}
	})
}
