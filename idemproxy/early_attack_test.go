package idemproxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// partialUpstream reads the first part of a request's body, acts on it (a
// streamed import that stores rows as it parses them), and then refuses
// the rest with status, closing the connection without reading further.
type partialUpstream struct {
	status int
	read   int64
	acted  atomic.Int32
}

func (u *partialUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, err := io.CopyN(io.Discard, r.Body, u.read); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	u.acted.Add(1)
	w.Header().Set("Connection", "close")
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(u.status)
	io.WriteString(w, "row 1000 is invalid; rows before it were stored")
}

// TestEarlyAnswerAfterActingIsStored: an upstream that read part of the
// body and acted on it before it refused the rest (a 4xx such as 400, 409
// or 422, given while the proxy was still sending) did run the operation.
// Its answer is stored and replayed, as any other answer of the route's
// policy: releasing the key would run the operation again on the retry.
// Only a refusal that names the request itself (Expect, its size, its
// credentials, its method or media type) is passed on unstored.
func TestEarlyAnswerAfterActingIsStored(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			u := &partialUpstream{status: code, read: 16 << 10}
			_, addr := expectRig(t, "", u)
			const size = 256 << 10 // far more than the upstream reads
			body := strings.Repeat("x", size)
			for i := range 2 {
				x := expectExchange(t, addr, expectHead("k", size), body, false)
				if x.final.StatusCode != code {
					t.Fatalf("try %d: %d %q, want %d", i+1, x.final.StatusCode, x.body, code)
				}
			}
			if n := u.acted.Load(); n != 1 {
				t.Fatalf("the upstream acted %d times on one key, want once: the retry of an answer given mid-body ran again", n)
			}
		})
	}
}
