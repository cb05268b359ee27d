package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestFloor checks that the floor keeps the promise it is measured as
// keeping: one run per key, the stored answer replayed, 422 for another
// body under a key, 409 while the first runs, 400 without a key, and the
// key freed when the handler panics.
func TestFloor(t *testing.T) {
	runs := 0
	block := make(chan struct{})
	inside := make(chan struct{})
	f := newFloor(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		switch r.URL.Path {
		case "/slow":
			close(inside)
			<-block
		case "/panic":
			panic("boom")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"n":` + string(rune('0'+runs)) + `}`))
	}))
	send := func(path, key, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		f.ServeHTTP(rec, req)
		return rec
	}
	first := send("/pay", "k1", `{"a":1}`)
	again := send("/pay", "k1", `{"a":1}`)
	if first.Code != http.StatusCreated || again.Code != http.StatusCreated || again.Body.String() != first.Body.String() ||
		again.Header().Get("Content-Type") != "application/json" || runs != 1 {
		t.Fatalf("replay: first %d %q, again %d %q %v, runs %d", first.Code, first.Body, again.Code, again.Body, again.Header(), runs)
	}
	if rec := send("/pay", "k1", `{"a":2}`); rec.Code != http.StatusUnprocessableEntity {
		t.Errorf("another body under a key: %d, want 422", rec.Code)
	}
	if rec := send("/pay", "", `{}`); rec.Code != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", rec.Code)
	}
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- send("/slow", "k2", "") }()
	<-inside
	if rec := send("/slow", "k2", ""); rec.Code != http.StatusConflict || rec.Header().Get("Retry-After") == "" {
		t.Errorf("duplicate in flight: %d %v, want 409 with Retry-After", rec.Code, rec.Header())
	}
	close(block)
	if rec := <-done; rec.Code != http.StatusCreated {
		t.Errorf("the slow request: %d", rec.Code)
	}
	func() {
		defer func() { _ = recover() }()
		send("/panic", "k3", "")
	}()
	if rec := send("/pay", "k3", ""); rec.Code != http.StatusCreated {
		t.Errorf("after a panic the key is free: %d, want 201", rec.Code)
	}
	if runs != 4 {
		t.Errorf("runs = %d, want 4", runs)
	}
}
