package idem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// serve runs f's protected handler on a real server, which the Hijack and
// ResponseController paths need, and returns a function that POSTs with a
// key.
func (f *fixture) serve(t *testing.T) func(key string, trace *httptrace.ClientTrace) (*http.Response, string) {
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	return func(key string, trace *httptrace.ClientTrace) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("X-User", "alice")
		req.Header.Set(idem.HeaderName, key)
		if trace != nil {
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
}

// A handler that hijacks the connection answers on its own; the key is then
// completed as not replayable, and a retry gets 409, never a second run.
// The client can read the hijacked answer before the middleware settles the
// key, so the retry waits for the settlement.
func TestMiddlewareHijack(t *testing.T) {
	t.Parallel()
	settled := make(chan idem.Event, 1)
	cfg := idem.Config{OnOutcome: func(ev idem.Event) { settled <- ev }}
	f := newFixture(t, cfg, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack through the middleware: %v", err)
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		rw.Flush()
	})
	post := f.serve(t)
	if resp, body := post("k", nil); resp.StatusCode != 200 || body != "hijacked" {
		t.Fatalf("hijacked answer: %d %q", resp.StatusCode, body)
	}
	select {
	case ev := <-settled:
		if ev.Settlement != "not_replayable" {
			t.Fatalf("hijacked request settled as %q", ev.Settlement)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the hijacked request was never settled")
	}
	resp, _ := post("k", nil)
	if resp.StatusCode != http.StatusConflict || resp.Header.Get("Idempotency-Outcome") != "not_replayable" {
		t.Fatalf("retry after a hijack: %d %v", resp.StatusCode, resp.Header)
	}
	rec, err := f.store.Get(t.Context(), idemstore.Key{Scope: "user:alice", Operation: "POST /payments", Key: "k"})
	if err != nil || rec.State != idemstore.StateCompleted || rec.Response.NotReplayable != idem.NotReplayableHijacked {
		t.Fatalf("record after a hijack: %+v, %v", rec, err)
	}
	if n := f.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

// http.ResponseController reaches the real writer through the capture
// (Unwrap), and a deadline does not make the answer unreplayable.
func TestMiddlewareResponseController(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Errorf("SetWriteDeadline through the middleware: %v", err)
		}
		if err := rc.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Errorf("SetReadDeadline through the middleware: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	})
	post := f.serve(t)
	if resp, body := post("k", nil); resp.StatusCode != 201 || body != "paid" {
		t.Fatalf("first: %d %q", resp.StatusCode, body)
	}
	if resp, body := post("k", nil); resp.StatusCode != 201 || body != "paid" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// An informational answer (103 Early Hints) goes out at once and is not
// taken for the final status, which is what gets stored and replayed.
func TestMiddlewareEarlyHints(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	})
	post := f.serve(t)
	var hints []int
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
		hints = append(hints, code)
		return nil
	}}
	if resp, body := post("k", trace); resp.StatusCode != 201 || body != "paid" || len(hints) != 1 || hints[0] != 103 {
		t.Fatalf("first: %d %q, 1xx %v", resp.StatusCode, body, hints)
	}
	if resp, body := post("k", nil); resp.StatusCode != 201 || body != "paid" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q", resp.StatusCode, body)
	}
}

// Headers named in Connection are hop-by-hop too, and never stored.
func TestMiddlewareConnectionListedHeaders(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, func(f *fixture, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Hop, x-other-hop")
		w.Header().Set("X-Hop", "one connection only")
		w.Header().Set("X-Other-Hop", "this one too")
		w.Header().Set("X-Kept", "end to end")
		w.WriteHeader(http.StatusCreated)
	})
	f.do(call{key: "k"})
	w := f.do(call{key: "k"})
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v", w.Code, w.Header())
	}
	if h := w.Header(); h.Get("X-Kept") != "end to end" || h.Get("X-Hop") != "" || h.Get("X-Other-Hop") != "" || h.Get("Connection") != "" {
		t.Fatalf("replayed headers: %v", h)
	}
}
