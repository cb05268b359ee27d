package idemproxy_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// BenchmarkLegacyOperations measures what looking for records stored
// under an earlier version's operation name costs a new key: one store
// read after the key is reserved (on the memory store here; a round trip
// on a server store). A retry the new name answers reads nothing more.
func BenchmarkLegacyOperations(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	b.Cleanup(up.Close)
	body := []byte(`{"amount":1000,"currency":"usd"}`)
	var seq atomic.Int64
	for _, legacy := range []bool{true, false} {
		b.Run("legacy_operations="+strconv.FormatBool(legacy), func(b *testing.B) {
			mem := idemmem.MustNew(idemmem.Config{})
			b.Cleanup(func() { mem.Close() })
			engine, err := idem.NewEngine(mem, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			proxy, err := idemproxy.New(engine, idemproxy.Config{Upstream: up.URL, LegacyOperations: &legacy}, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", "Bearer bench")
					req.Header.Set("Idempotency-Key", "k-"+strconv.FormatInt(seq.Add(1), 10))
					rec := httptest.NewRecorder()
					proxy.ServeHTTP(rec, req)
					if rec.Code != http.StatusCreated {
						b.Fatalf("answered %d", rec.Code)
					}
				}
			})
		})
	}
}
