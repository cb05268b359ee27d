package idemproxy

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func testWebhook(url string, queue int) (*webhook, *[]time.Duration) {
	var pauses []time.Duration
	w := newWebhook(url, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hooks"}, []string{"result"}), quiet)
	w.queue = make(chan reviewEvent, queue)
	w.sleep = func(ctx context.Context, d time.Duration) error { pauses = append(pauses, d); return ctx.Err() }
	return w, &pauses
}

var testEvent = reviewEvent{ID: "id1", Scope: "anonymous", Operation: "POST /pay", Key: "k1", Reason: "reset", Method: "POST", Path: "/pay",
	At: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}

func TestWebhookDelivers(t *testing.T) {
	t.Parallel()
	got := make(chan map[string]any, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev map[string]any
		if r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&ev) != nil {
			t.Errorf("the webhook got %s %v", r.Header.Get("Content-Type"), ev)
		}
		got <- ev
	}))
	defer srv.Close()
	w, _ := testWebhook(srv.URL, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.run(ctx); close(done) }()
	if !w.enqueue(testEvent) {
		t.Fatal("enqueue refused an event with an empty queue")
	}
	ev := <-got
	for name, want := range map[string]string{"id": "id1", "scope": "anonymous", "operation": "POST /pay", "key": "k1", "reason": "reset",
		"method": "POST", "path": "/pay", "at": "2030-01-01T00:00:00Z"} {
		if ev[name] != want {
			t.Errorf("%s = %v, want %s", name, ev[name], want)
		}
	}
	// One worker delivers in order: once the second event arrived, the
	// first delivery is counted.
	w.enqueue(testEvent)
	<-got
	cancel()
	<-done
	if n := testutil.ToFloat64(w.results.WithLabelValues("delivered")); n < 1 {
		t.Errorf("delivered = %v, want 1", n)
	}
}

// TestWebhookTargetDown: a target that fails or is not there is tried a
// bounded number of times, with doubling pauses, and the event is counted
// as failed.
func TestWebhookTargetDown(t *testing.T) {
	t.Parallel()
	var tries atomic.Int32
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tries.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer failing.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "http://" + ln.Addr().String()
	ln.Close()
	for _, url := range []string{failing.URL, closed} {
		w, pauses := testWebhook(url, 10)
		if err := w.deliver(context.Background(), testEvent); err == nil {
			t.Fatalf("%s: delivered", url)
		}
		if len(*pauses) != webhookAttempts-1 || (*pauses)[0] != webhookBackoff || (*pauses)[1] != 2*webhookBackoff {
			t.Errorf("%s: pauses %v", url, *pauses)
		}
	}
	if tries.Load() != webhookAttempts {
		t.Errorf("the failing target was tried %d times, want %d", tries.Load(), webhookAttempts)
	}
}

// TestWebhookQueueFull: with the worker stuck, enqueue never waits; past
// the queue's size, events are dropped and counted.
func TestWebhookQueueFull(t *testing.T) {
	t.Parallel()
	w, _ := testWebhook("http://127.0.0.1:1", 3)
	for i := 0; i < 3; i++ {
		if !w.enqueue(testEvent) {
			t.Fatalf("event %d refused", i)
		}
	}
	if w.enqueue(testEvent) {
		t.Fatal("a fourth event fitted a queue of 3")
	}
	if n := testutil.ToFloat64(w.results.WithLabelValues("dropped")); n != 1 {
		t.Errorf("dropped = %v, want 1", n)
	}
}
