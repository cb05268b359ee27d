package idemproxy_test

import (
	"bufio"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"testing"
	"testing/synctest"

	"github.com/idem-dev/idem/idemproxy"
)

// TestConnectionLimit: with max_connections 1, a second client is not
// taken while the first keeps its connection open, and is served once the
// first closes it.
func TestConnectionLimit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), ErrorLog: log.New(io.Discard, "", 0)}
		go srv.Serve(idemproxy.LimitConnections(l, 1))
		defer srv.Close()
		get := func(c net.Conn) string {
			go io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}
		first, err := l.dial(context.Background(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		if got := get(first); got != "ok" {
			t.Fatalf("first: %q", got)
		}
		second := make(chan net.Conn)
		go func() {
			c, err := l.dial(context.Background(), "", "")
			if err != nil {
				t.Error(err)
			}
			second <- c
		}()
		synctest.Wait()
		select {
		case <-second:
			t.Fatal("a second connection was taken while the first was open")
		default:
		}
		first.Close()
		c := <-second
		defer c.Close()
		if got := get(c); got != "ok" {
			t.Fatalf("second: %q", got)
		}
	})
}
