package idemproxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// stalledWrites is a connection whose writes reach the peer and then
// return only once release is closed: the transport's writer has not
// counted them yet when the peer answers.
type stalledWrites struct {
	net.Conn
	release chan struct{}
}

func (c stalledWrites) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	<-c.release
	return n, err
}

// TestAnsweredRequestWasSent: an upstream that answered had the request,
// whatever the count of bytes written says: a protected request that got
// a 101 it did not ask for (the proxy drops its upgrade) goes to review,
// not released as never sent, even when the transport's writer has yet to
// count the bytes the upstream read. Released, a retry ran it again.
func TestAnsweredRequestWasSent(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe()
		t.Cleanup(func() { server.Close() })
		go func() {
			br := bufio.NewReader(server)
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(server, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		}()
		return &countingConn{Conn: stalledWrites{client, release}}, nil
	}}
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	quiet := slog.New(slog.DiscardHandler)
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(engine, Config{Upstream: "http://upstream.invalid", Settings: Settings{Anonymous: AnonymousShared}}, Options{Logger: quiet, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k")
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, req)
	if got := rec.Header().Get("Idempotency-Outcome"); rec.Code != http.StatusBadGateway || got != idem.SituationUpstreamFailed.Name {
		t.Fatalf("a 101 to a protected request: %d %s %q; want 502 %s", rec.Code, got, rec.Body, idem.SituationUpstreamFailed.Name)
	}
	rec2, err := store.Get(context.Background(), idemstore.Key{Scope: AnonymousScope, Operation: "POST /pay host=example.com upstream=" + p.upstreamName, Key: "k"})
	if err != nil || rec2.State != idemstore.StateNeedsReview {
		t.Fatalf("the key: %+v %v; want it in review", rec2, err)
	}
}
