package idem_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// TestObserveBodyReadErrorReachesHandler: in observe mode a request body
// that fails mid-way is passed to the handler as the client sent it (the
// bytes read, then the same error) instead of idem answering 400, and the
// request is counted would_refuse.
func TestObserveBodyReadErrorReachesHandler(t *testing.T) {
	t.Parallel()
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var ev idem.Event
	mw, err := idem.NewMiddleware(e, idem.Config{
		Scope:     func(*http.Request) (string, error) { return "s", nil },
		Policy:    idem.Policy{Observe: true},
		OnOutcome: func(e idem.Event) { ev = e },
	})
	if err != nil {
		t.Fatal(err)
	}
	broken := errors.New("connection reset mid-body")
	var got string
	var gotErr error
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		got, gotErr = string(b), err
		w.WriteHeader(http.StatusAccepted)
	}))
	r := httptest.NewRequest(http.MethodPost, "/pay", io.MultiReader(strings.NewReader(`{"amount":`), failing{broken}))
	r.Header.Set("Idempotency-Key", "k")
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusAccepted || w.Header().Get("Idempotency-Outcome") != "" {
		t.Fatalf("observe mode answered a broken body itself: %d %v %s", w.Code, w.Header(), w.Body)
	}
	if got != `{"amount":` || !errors.Is(gotErr, broken) {
		t.Errorf("handler read %q, %v; want the bytes sent, then the error", got, gotErr)
	}
	if ev.Finding != idem.FindingWouldRefuse {
		t.Errorf("finding %q, want would_refuse", ev.Finding)
	}
}

type failing struct{ err error }

func (f failing) Read([]byte) (int, error) { return 0, f.err }
