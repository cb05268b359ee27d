package idemproxy_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemproxy"
)

// TestBodiesReachTheUpstreamWhole: a protected request's body reaches the
// upstream byte for byte and with its length, whether the proxy copies it
// into the transport's first write (small bodies) or streams it.
func TestBodiesReachTheUpstreamWhole(t *testing.T) {
	t.Parallel()
	tp := newTestProxy(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(b)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "%d %s %d", len(b), hex.EncodeToString(sum[:]), r.ContentLength)
	})
	for _, n := range []int{1, 2047, 2048, 2049, 4096, 64 << 10} {
		body := make([]byte, n)
		rand.Read(body)
		resp, got := tp.send(t, http.MethodPost, "/upload", "k"+strconv.Itoa(n), bytes.NewReader(body))
		sum := sha256.Sum256(body)
		if want := fmt.Sprintf("%d %s %d", n, hex.EncodeToString(sum[:]), n); resp.StatusCode != http.StatusCreated || got != want {
			t.Errorf("%d bytes: %d %q, want %q", n, resp.StatusCode, got, want)
		}
	}
}

// TestObserveShortBody: in observe mode, a body shorter than its
// Content-Length (the client stopped sending) is passed on as it came, and
// the upstream never gets a whole body, though the proxy copies small
// bodies before the round trip.
func TestObserveShortBody(t *testing.T) {
	t.Parallel()
	var whole atomic.Bool
	op := newObserveProxy(t, idemproxy.Config{}, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err == nil && len(b) == 100 {
			whole.Store(true)
		}
		w.WriteHeader(http.StatusCreated)
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(op.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":1}")
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusBadRequest || resp.Header.Get("Idempotency-Outcome") == idem.SituationBodyUnreadable.Name {
		t.Errorf("observe mode answered a short body itself: %d %v", resp.StatusCode, resp.Header)
	}
	if resp.StatusCode == http.StatusCreated || whole.Load() {
		t.Errorf("a 7-byte body announced as 100 reached the upstream as a whole request: %d", resp.StatusCode)
	}
	if ev := op.last(t); ev.Finding != idem.FindingWouldRefuse {
		t.Errorf("finding %q, want would_refuse", ev.Finding)
	}
}
