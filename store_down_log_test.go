package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// downStore cannot be reached.
type downStore struct{ idemstore.Store }

var errStoreDown = fmt.Errorf("dial tcp 127.0.0.1:1: connection refused: %w", idemstore.ErrUnavailable)

func (downStore) Reserve(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	return nil, false, errStoreDown
}
func (downStore) Release(context.Context, idemstore.ReleaseParams) error { return errStoreDown }
func (downStore) Get(context.Context, idemstore.Key) (*idemstore.Record, error) {
	return nil, errStoreDown
}

// TestStoreDownLogsPlainly: with the store unreachable, the log says so and
// says that requests get 503, once per interval with the count of the
// lines left out, instead of an error about a reservation per request.
func TestStoreDownLogsPlainly(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	var (
		mu  sync.Mutex
		now = time.Unix(1_000_000, 0)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var logs syncBuffer
	e, err := idem.NewEngine(downStore{mem}, idem.EngineConfig{Now: clock, SettleTimeout: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	h := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran with the store down")
	}))
	send := func(key string) {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
		r.Header.Set(idem.HeaderName, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusServiceUnavailable {
			t.Fatalf("status %d", w.Code)
		}
	}
	for i := range 5 {
		send(fmt.Sprint("k-", i))
	}
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()
	send("k-5")
	out := logs.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	const msg = `msg="idem: the store is unreachable; requests get 503 and are not run until it answers"`
	if len(lines) != 2 || !strings.Contains(lines[0], msg) || !strings.Contains(lines[0], "unlogged_since_last=0") ||
		!strings.Contains(lines[1], msg) || !strings.Contains(lines[1], "unlogged_since_last=4") {
		t.Fatalf("want two lines saying the store is unreachable, the second counting 4 left out:\n%s", out)
	}
	if strings.Contains(out, "releasing a reservation") {
		t.Fatalf("a line about a reservation:\n%s", out)
	}
}
