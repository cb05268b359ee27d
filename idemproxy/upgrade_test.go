package idemproxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemproxy"
)

// tunnelUpstream switches protocols whenever a request asks to, and then
// answers every line that comes through the tunnel; it records the Upgrade
// header of every request it gets.
type tunnelUpstream struct {
	mu       sync.Mutex
	upgrades []string
}

func (u *tunnelUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	up := r.Header.Get("Upgrade")
	u.mu.Lock()
	u.upgrades = append(u.upgrades, r.Method+" "+r.URL.Path+" Upgrade="+up)
	u.mu.Unlock()
	if up == "" {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "plain")
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", up)
	brw.Flush()
	for {
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		fmt.Fprintf(brw, "tunnel saw %q\n", strings.TrimSpace(line))
		brw.Flush()
	}
}

func (u *tunnelUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.upgrades...)
}

// TestProtectedRequestNeverTunnels: an upgrade on a protected request is
// dropped (a server may ignore one), so the request runs as a plain POST
// and the connection stays HTTP through idem: a request sent on it after
// is idem's to check, not a tunnel's to carry past it. An h2c upgrade is
// dropped on any request, since a tunnel speaking HTTP would carry every
// later request unseen; other upgrades of unprotected requests (a
// WebSocket) still tunnel.
func TestProtectedRequestNeverTunnels(t *testing.T) {
	t.Parallel()
	up := &tunnelUpstream{}
	r := newAttackRig(t, up.ServeHTTP, idemproxy.Config{}, idem.EngineConfig{})
	dial := func() (net.Conn, *bufio.Reader) {
		conn, err := net.Dial("tcp", r.front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(20 * time.Second)) // a guard against a hang
		return conn, bufio.NewReader(conn)
	}

	conn, br := dial()
	io.WriteString(conn, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 2\r\n\r\n{}"+
		"POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	for i, want := range []int{http.StatusCreated, http.StatusBadRequest} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i+1, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("answer %d: %d %q; want %d (the first run as a plain POST, the second checked by idem)", i+1, resp.StatusCode, b, want)
		}
	}
	r.event(t)
	r.event(t)

	conn, br = dial()
	io.WriteString(conn, "GET /h2 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("GET with an h2c upgrade: %v %v; want a plain answer", resp, err)
	}

	conn, br = dial()
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("GET with a WebSocket upgrade: %v %v; want 101", resp, err)
	}
	io.WriteString(conn, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "tunnel saw \"hello\"\n" {
		t.Fatalf("through the WebSocket tunnel: %q %v", line, err)
	}

	if got, want := strings.Join(up.seen(), ", "), "POST /pay Upgrade=, GET /h2 Upgrade=, GET /ws Upgrade=websocket"; got != want {
		t.Fatalf("the upstream saw %s; want %s", got, want)
	}
}
