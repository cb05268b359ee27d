package idem_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// TestBodyBufferSizedFromContentLength: a body that announces its length
// ends in a buffer of that size, not one grown past it by doubling (which,
// for 1 MiB − 1 bytes, ended at 2 MiB); it grows with what arrives, never
// ahead of it. A body without a length still grows, and every
// body is still bounded by the limit.
func TestBodyBufferSizedFromContentLength(t *testing.T) {
	t.Parallel()
	const size = 1<<20 - 1
	body := strings.Repeat("x", size)
	var buf bytes.Buffer
	over, _, err := idem.ReadLimited(&buf, io.LimitReader(strings.NewReader(body), size), size, 1<<20, nil)
	if err != nil || over || buf.Len() != size {
		t.Fatalf("read %d bytes, over %v, %v", buf.Len(), over, err)
	}
	if c := buf.Cap(); c > size+64<<10 {
		t.Fatalf("a %d-byte body with its Content-Length took a %d-byte buffer", size, c)
	}
	for _, tc := range []struct {
		name        string
		body        string
		size, limit int64
		over        bool
	}{
		{"no length", body, -1, 1 << 20, false},
		{"no length, over", body + "xx", -1, 1 << 20, true},
		{"a length over the limit", body, size, 100, true},
		{"a length that lies short", body, 10, 1 << 20, false},
	} {
		var b bytes.Buffer
		over, _, err := idem.ReadLimited(&b, strings.NewReader(tc.body), tc.size, tc.limit, nil)
		if err != nil || over != tc.over || (!over && b.String() != tc.body) {
			t.Errorf("%s: read %d bytes, over %v, %v; want over %v", tc.name, b.Len(), over, err, tc.over)
		}
	}
}

// TestBodyBudgetChargedAsBytesArrive: a body is charged for the room its
// bytes fill as they arrive, never for the length it announces: one that
// announces 1 MiB and sends a byte holds 512 bytes; one that arrives whole
// holds at most twice its bytes (and never past its length and a byte);
// one that finds no room left stops with what it took.
func TestBodyBudgetChargedAsBytesArrive(t *testing.T) {
	t.Parallel()
	stall := errors.New("stalled")
	b := idem.NewBodyBudget(4 << 10)
	var buf bytes.Buffer
	_, held, err := idem.ReadLimited(&buf, io.MultiReader(strings.NewReader("{"), errReader{stall}), 1<<20, 1<<20, b)
	if !errors.Is(err, stall) || held != 512 || b.Used() != 512 || buf.Cap() > 512 {
		t.Fatalf("a stalled 1 MiB body: held %d, used %d, buffer %d, %v; want 512", held, b.Used(), buf.Cap(), err)
	}
	for _, size := range []int64{1, 511, 512, 513, 1500, 3000} {
		var buf bytes.Buffer
		over, got, err := idem.ReadLimited(&buf, strings.NewReader(strings.Repeat("x", int(size))), size, 1<<20, b)
		if err != nil || over || int64(buf.Len()) != size || got > max(512, 2*size) || got > size+1 || int64(buf.Cap()) > got {
			t.Errorf("%d bytes: held %d, buffer %d, over %v, %v", size, got, buf.Cap(), over, err)
		}
		if err == nil {
			idem.ReleaseBudget(b, got)
		}
	}
	_, more, err := idem.ReadLimited(&bytes.Buffer{}, strings.NewReader(strings.Repeat("x", 8000)), -1, 1<<20, b)
	if !errors.Is(err, idem.ErrNoRoom) || b.Used() != held+more || b.Used() > b.Max() {
		t.Fatalf("a body past the budget: took %d, used %d, %v; want no room", more, b.Used(), err)
	}
	idem.ReleaseBudget(b, held+more)
	if b.Used() != 0 {
		t.Fatalf("used %d after every body gave its share back", b.Used())
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// panicReader is a body whose Read panics.
type panicReader struct{}

func (panicReader) Read([]byte) (int, error) { panic("body read failed") }

// TestBodyBudgetGivenBackOnEveryPath: the middleware gives a body's share
// of Config.BodyBudget back once the request is done, however it ends: an
// answer, a replay, a body that cannot be read or whose Read panics, a
// body over the limit, a handler that panics; and one that finds no room gets 503 busy with
// Retry-After, unrun, and closes the connection.
func TestBodyBudgetGivenBackOnEveryPath(t *testing.T) {
	t.Parallel()
	b := idem.NewBodyBudget(4 << 10)
	f := newFixture(t, idem.Config{BodyBudget: b, Policy: idem.Policy{MaxRequestBody: 2000}}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("handler failed")
		}
		paymentHandler(f, w, r)
	})
	wantZero := func(what string) {
		t.Helper()
		if u := b.Used(); u != 0 {
			t.Fatalf("%s: %d bytes still held", what, u)
		}
	}
	if w := f.do(call{key: "a"}); w.Code != http.StatusCreated {
		t.Fatalf("answer: %d", w.Code)
	}
	wantZero("an answer")
	if w := f.do(call{key: "a"}); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d", w.Code)
	}
	wantZero("a replay")
	if w := f.do(call{key: "b", body: strings.Repeat("x", 2001)}); w.Code != http.StatusRequestEntityTooLarge || w.Header().Get("Connection") != "close" {
		t.Fatalf("over the limit: %d %v", w.Code, w.Header())
	}
	wantZero("a body over the limit")
	r := f.request(call{key: "c"})
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader("{"), errReader{errors.New("client gone")}))
	if w := httptest.NewRecorder(); func() int { f.h.ServeHTTP(w, r); return w.Code }() != http.StatusBadRequest {
		t.Fatalf("unreadable body: %d", w.Code)
	}
	wantZero("a body that could not be read")
	func() {
		defer func() { recover() }()
		f.do(call{key: "d", path: "/panic"})
	}()
	wantZero("a handler that panicked")
	r = f.request(call{key: "f"})
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader("{"), panicReader{}))
	func() {
		defer func() { recover() }()
		f.h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	wantZero("a body whose Read panicked")
	// No room: a body is refused busy at once, unrun.
	if !idem.AcquireBudget(b, 4<<10-10) {
		t.Fatal("the budget refused its own size")
	}
	runs := f.runs.Load()
	w := f.do(call{key: "e"})
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || w.Header().Get("Idempotency-Outcome") != "busy" ||
		w.Header().Get("Connection") != "close" || f.runs.Load() != runs {
		t.Fatalf("no room: %d %v, runs %d → %d; want 503 busy, unrun", w.Code, w.Header(), runs, f.runs.Load())
	}
	idem.ReleaseBudget(b, 4<<10-10)
	wantZero("a body refused busy")
	if w := f.do(call{key: "e"}); w.Code != http.StatusCreated {
		t.Fatalf("the busy request, retried: %d", w.Code)
	}
}
