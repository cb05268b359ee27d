package idemsqlite_test

import (
	"strconv"
	"testing"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/internal/tools/storebench"
)

// BenchmarkSynchronous is the cost of synchronous=FULL, idem serve's
// default (an acknowledged reservation survives a power loss), against
// NORMAL, the opt-in: Reserve+Complete pairs with group commit on, at one
// goroutine and at 32.
func BenchmarkSynchronous(b *testing.B) {
	for _, sync := range []idemsqlite.Synchronous{idemsqlite.SynchronousNormal, idemsqlite.SynchronousFull} {
		for _, n := range []int{1, 32} {
			b.Run(string(sync)+"/c="+strconv.Itoa(n), func(b *testing.B) {
				db := openDB(b, idemsqlite.OpenOptions{Synchronous: sync})
				s, err := idemsqlite.New(db, idemsqlite.Config{})
				if err != nil {
					b.Fatal(err)
				}
				storebench.Run(b, n, s.Batcher(), storebench.StorePair(s))
			})
		}
	}
}
