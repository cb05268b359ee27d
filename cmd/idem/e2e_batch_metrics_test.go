package main_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TestBatchMetrics: /metrics counts the SQL store's group commit: each
// Reserve and Complete once, either in a batch or alone. With batch=off,
// and on a store that does not batch, the counters are absent.
func TestBatchMetrics(t *testing.T) {
	t.Parallel()
	const n = 16
	up := newUpstream(t)
	// A long lease, so that no heartbeat Extend joins the calls counted.
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--admin", "127.0.0.1:0", "--lease", "1h")
	eventually(t, "the store's counters", func() bool { return metric(t, p, "idem_store_batches_total") >= 0 })
	want(t, "batches before any request", metric(t, p, "idem_store_batches_total"), 0.0)
	want(t, "calls alone before any request", metric(t, p, "idem_store_unbatched_calls_total"), 0.0)

	// n requests reserve their keys and wait at the upstream; released
	// together, their Completes reach the store at about the same time.
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", "http://"+p.addr+"/pay?hold=1", strings.NewReader(`{"amount":1}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "k"+strconv.Itoa(i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 201 {
				t.Errorf("request %d: status %d, want 201", i, resp.StatusCode)
			}
		})
	}
	eventually(t, "every request reaching the upstream", func() bool { return up.runs("/pay") == n })
	up.release()
	wg.Wait()

	batched := metric(t, p, "idem_store_batched_calls_total")
	alone := metric(t, p, "idem_store_unbatched_calls_total")
	batches := metric(t, p, "idem_store_batches_total")
	if batched+alone != 2*n {
		t.Errorf("batched %v + alone %v calls, want %d (a Reserve and a Complete per request)", batched, alone, 2*n)
	}
	if batches < 0 || batches > batched || (batched > 0) != (batches > 0) {
		t.Errorf("%v batches for %v batched calls", batches, batched)
	}

	for _, store := range []string{sqliteStore(t) + "?batch=off", "memory://"} {
		q := startProxy(t, "--upstream", up.URL, "--store", store, "--admin", "127.0.0.1:0")
		want(t, store+": status", do(t, "POST", "http://"+q.addr+"/pay", "k", `{"amount":1}`).status, 201)
		for _, name := range []string{"idem_store_batches_total", "idem_store_batched_calls_total", "idem_store_unbatched_calls_total"} {
			want(t, store+": "+name, metric(t, q, name), -1.0)
		}
	}
}
