package idemproxy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// downStore fails every Get with an error that names the store's host.
type downStore struct{ idemstore.Store }

func (downStore) Get(context.Context, idemstore.Key) (*idemstore.Record, error) {
	return nil, errors.New("dial tcp db.internal:5432 user=idem: connection refused")
}

func TestReadyzDoesNotEchoTheStoreError(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	defer mem.Close()
	var logs bytes.Buffer
	h := adminHandler(downStore{mem}, NewMetrics(), nil, slog.New(slog.NewTextHandler(&logs, nil)))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	if w.Code != 503 {
		t.Fatalf("status %d", w.Code)
	}
	if strings.Contains(w.Body.String(), "db.internal") || strings.Contains(w.Body.String(), "user=") {
		t.Errorf("/readyz echoes the store error: %q", w.Body)
	}
	if !strings.Contains(logs.String(), "db.internal:5432") {
		t.Errorf("the log does not say why: %q", logs.String())
	}
	w = httptest.NewRecorder()
	adminHandler(mem, NewMetrics(), nil, slog.New(slog.DiscardHandler)).ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	if w.Code != 200 || w.Body.String() != "ready\n" {
		t.Errorf("a store that answers: %d %q", w.Code, w.Body)
	}
}

func TestAdminAddr(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		":9090":          "127.0.0.1:9090",
		":0":             "127.0.0.1:0",
		"0.0.0.0:9090":   "0.0.0.0:9090",
		"[::]:9090":      "[::]:9090",
		"10.0.0.5:9090":  "10.0.0.5:9090",
		"localhost:9090": "localhost:9090",
	} {
		if got := AdminAddr(in); got != want {
			t.Errorf("AdminAddr(%q) = %q, want %q", in, got, want)
		}
	}
}
