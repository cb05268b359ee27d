package idemproxy_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"strings"
	"testing"
)

// TestReplayDecodesFewCodings: each content coding idem decodes for a
// replay holds a decompressor (its window and tables) while the replay is
// written, charged once to max_replay_memory. An answer stored with more
// codings than one replay is charged for (here gzip applied 64 times,
// which a stored answer of 1 MiB can carry thousands of) is not decoded:
// a retry that does not accept it gets 406 naming the codings, and one
// that accepts gzip still gets it as stored.
func TestReplayDecodesFewCodings(t *testing.T) {
	t.Parallel()
	const layers = 64
	body := []byte("the answer")
	for range layers {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write(body)
		zw.Close()
		body = b.Bytes()
	}
	coding := strings.TrimSuffix(strings.Repeat("gzip, ", layers), ", ")
	u := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Encoding", coding)
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
	_, addr := expectRig(t, "", u)
	x := expectExchange(t, addr, expectHead("k", 5, "Accept-Encoding: gzip\r\n"), "hello", false)
	if x.final.StatusCode != http.StatusCreated || x.body != string(body) {
		t.Fatalf("first try: %d, %d bytes; want 201 with the coded body", x.final.StatusCode, len(x.body))
	}
	x = expectExchange(t, addr, expectHead("k", 5), "hello", false)
	if x.final.StatusCode != http.StatusNotAcceptable || x.final.Header.Get("Idempotency-Outcome") != "not_acceptable" {
		t.Fatalf("a retry without Accept-Encoding of an answer coded %d times: %d %q (%d bytes); want 406 not_acceptable, not %d decoders at once",
			layers, x.final.StatusCode, x.final.Header.Get("Idempotency-Outcome"), len(x.body), layers)
	}
	x = expectExchange(t, addr, expectHead("k", 5, "Accept-Encoding: gzip\r\n"), "hello", false)
	if x.final.StatusCode != http.StatusCreated || x.body != string(body) || x.final.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a retry accepting gzip: %d (replayed %q); want the stored 201 as stored", x.final.StatusCode, x.final.Header.Get("Idempotent-Replayed"))
	}
}
