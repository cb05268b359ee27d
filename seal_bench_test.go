package idem_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// BenchmarkSealing is BenchmarkEngineSteadyState's begin-complete and
// BenchmarkEngine's replay on the memory store, without and with a
// Sealer (idemseal, AES-256-GCM): the cost of sealing every answer and
// opening every replay.
func BenchmarkSealing(b *testing.B) {
	for _, sealed := range []bool{false, true} {
		name := "plain"
		if sealed {
			name = "sealed"
		}
		cfg := func() idem.EngineConfig {
			const ring = 4096
			var secs atomic.Int64
			secs.Store(time.Now().Unix())
			c := idem.EngineConfig{Now: func() time.Time { return time.Unix(secs.Add(1), 0) }, Retention: ring * time.Second}
			if sealed {
				c.Sealer = keyring(b, "a")
			}
			return c
		}
		b.Run(name+"/begin-complete", func(b *testing.B) {
			e, _ := newEngine(b, cfg())
			benchBeginComplete(b, e, 4096)
		})
		b.Run(name+"/replay", func(b *testing.B) {
			c := cfg()
			c.Now = nil
			e, _ := newEngine(b, c)
			benchReplay(b, e)
		})
	}
}
