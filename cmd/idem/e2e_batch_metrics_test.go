package main_test

import (
	"strconv"
	"sync"
	"testing"
)

// TestBatchMetrics: /metrics counts the SQL store's group commit, every
// store call once, either in a batch or alone; with batch=off, and on a
// store that does not batch, the counters are absent.
func TestBatchMetrics(t *testing.T) {
	t.Parallel()
	const n = 16
	up := newUpstream(t)
	// A long lease, so that no heartbeat Extend joins the calls counted.
	p := startProxy(t, "--upstream", up.URL, "--store", sqliteStore(t), "--admin", "127.0.0.1:0", "--lease", "1h")
	want(t, "batches before any request", metric(t, p, "idem_store_batches_total"), 0.0)
	want(t, "calls alone before any request", metric(t, p, "idem_store_unbatched_calls_total"), 0.0)

	// n requests reserve their keys and wait at the upstream; released
	// together, their Completes reach the store at about the same time.
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			a := do(t, "POST", "http://"+p.addr+"/pay?hold=1", "k"+strconv.Itoa(i), `{"amount":1}`)
			want(t, "status", a.status, 201)
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
		do(t, "POST", "http://"+q.addr+"/pay", "k", `{"amount":1}`)
		for _, name := range []string{"idem_store_batches_total", "idem_store_batched_calls_total", "idem_store_unbatched_calls_total"} {
			want(t, store+": "+name, metric(t, q, name), -1.0)
		}
	}
}
