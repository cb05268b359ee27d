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
		completed := func(expires time.Duration) idemstore.Key {
			n++
			rec := f.reserve(f.key(fmt.Sprintf("k%03d", n)), leaseLong)
			f.complete(rec, jsonResponse(fmt.Sprintf(`{"n":%d}`, n)), expires)
			return rec.Key
		}
		var doomed, kept []idemstore.Key
		for range 24 {
			doomed = append(doomed, completed(expireSoon))
		}
		// ExpiresAt == Before is purged too.
		doomed = append(doomed, completed(clockLater))
		for range 3 {
			kept = append(kept, completed(expireLater))
		}
		kept = append(kept, completed(clockLater+time.Millisecond))
		for range 3 {
			n++
			kept = append(kept, f.reserve(f.key(fmt.Sprintf("k%03d", n)), leaseShort).Key)
		}
		for range 2 {
			n++
			rec := f.reserve(f.key(fmt.Sprintf("k%03d", n)), leaseShort)
			f.escalate(rec, "check")
			kept = append(kept, rec.Key)
		}
		keptBefore := make([]*idemstore.Record, len(kept))
		for i, k := range kept {
			keptBefore[i] = f.get(k)
		}

		before := f.base.Add(clockLater)
		purge := func(batch, want int) {
			t.Helper()
			var progress []int
			got, err := f.s.Purge(f.ctx(), idemstore.PurgeParams{Before: before, BatchSize: batch,
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
		for range 14 {
			completed(expireSoon)
		}
		purge(7, 14)

		// The default batch size.
		for range 3 {
			completed(expireSoon)
		}
		purge(0, 3)
		for _, r := range keptBefore {
			f.requireUnchanged(r, "Purge")
		}
	})
}
