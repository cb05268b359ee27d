package idemproxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestChunkedAnswersReplay checks that an upstream answer without a
// Content-Length, which ReverseProxy flushes as it copies, is still stored
// and replayed, while an event stream streams and is not replayable.
func TestChunkedAnswersReplay(t *testing.T) {
	t.Parallel()
	tp := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/events" {
			w.Header().Set("Content-Type", "text/event-stream")
		}
		io.WriteString(w, "chunk 1\n")
		w.(http.Flusher).Flush() // no Content-Length: chunked
		io.WriteString(w, "chunk 2\n")
	})
	post := func(path string) (int, string, http.Header) {
		resp, body := tp.send(t, http.MethodPost, path, "k"+path, strings.NewReader("{}"))
		return resp.StatusCode, body, resp.Header
	}
	for i := 0; i < 2; i++ {
		code, body, h := post("/chunked")
		if code != 200 || body != "chunk 1\nchunk 2\n" || (i == 1) != (h.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("chunked answer, call %d: %d %q %v", i+1, code, body, h)
		}
	}
	if code, body, _ := post("/events"); code != 200 || body != "chunk 1\nchunk 2\n" {
		t.Fatalf("event stream: %d %q", code, body)
	}
	if code, _, h := post("/events"); code != 409 || h.Get("Idempotency-Outcome") != "not_replayable" {
		t.Fatalf("event stream retry: %d %v", code, h)
	}
	if tp.runs.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", tp.runs.Load())
	}
}
