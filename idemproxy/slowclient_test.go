package idemproxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemproxy"
)

// memFront serves h on connections in memory, for a test in a synctest
// bubble, and returns a dial to it: the proxy's own http.Server, with
// write deadlines on fake time.
func memFront(t *testing.T, h http.Handler) func() net.Conn {
	t.Helper()
	l := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return func() net.Conn {
		c, err := l.dial(context.Background(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// slowRig is a proxy (on a memory store) behind memFront, in front of an
// upstream in memory that answers 200 with size bytes, with route POST
// /big's upstream_deadline and client_write_timeout as given; events gets
// every protected request's event.
func slowRig(t *testing.T, size int, deadline, writeTimeout string) (r *rig, dial func() net.Conn, events chan idem.Event, runs *counter) {
	t.Helper()
	runs = new(counter)
	chunk := bytes.Repeat([]byte("z"), 32<<10)
	tr := memUpstream(t, runs.wrap(func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body)
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for n := 0; n < size; n += len(chunk) {
			if _, err := w.Write(chunk[:min(len(chunk), size-n)]); err != nil {
				return
			}
		}
	}))
	cfg, err := idemproxy.ParseConfig(fmt.Appendf(nil, "upstream: http://upstream.invalid\nclient_write_timeout: %s\nroutes:\n  - match: POST /big\n    upstream_deadline: %s\n", writeTimeout, deadline))
	if err != nil {
		t.Fatal(err)
	}
	events = make(chan idem.Event, 8)
	r = newRig(t, cfg, idemproxy.Options{Transport: tr, OnOutcome: func(ev idem.Event) { events <- ev }})
	return r, memFront(t, r.proxy), events, runs
}

// askBig sends a protected POST /big on conn and reads the answer's status
// line and headers, not its body.
func askBig(t *testing.T, conn net.Conn) (*http.Response, *bufio.Reader) {
	t.Helper()
	go io.WriteString(conn, "POST /big HTTP/1.1\r\nHost: example.com\r\nIdempotency-Key: k\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"amount\":1}")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, br
}

// settled waits for the request's event: its key settled. A minute of fake
// time bounds the wait, so that a client holding the key fails the test
// instead of hanging it.
func settled(t *testing.T, events chan idem.Event) idem.Event {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(time.Minute):
		t.Fatal("the key was not settled within a minute (fake time): the client holds it")
		return idem.Event{}
	}
}

// wantCompletedNotReplayable checks what a client that did not take its
// whole answer leaves: the key completed as not replayable (the upstream
// answered in full), a retry answered 409 not_replayable, one upstream run.
func wantCompletedNotReplayable(t *testing.T, r *rig, ev idem.Event, runs *counter) {
	t.Helper()
	if got := r.state(t, "/big", "k"); got != "completed 200" || ev.Settlement != "not_replayable" {
		t.Fatalf("record %s, settlement %q; want completed 200, not replayable", got, ev.Settlement)
	}
	rec, _ := r.call(t, "/big", "k")
	wantAnswer(t, "retry", rec, http.StatusConflict, "not_replayable", "not-replayable")
	if n := runs.n.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

// TestClientThatNeverReads: a client that takes the status line of a 2 MiB
// answer (over what is kept) and then reads nothing is cut off once a
// write to it has waited client_write_timeout; the proxy reads the rest of
// the upstream's answer without it, and the key completes, as not
// replayable, at once: it neither holds its lease until the upstream
// deadline nor goes to review after it.
func TestClientThatNeverReads(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, dial, events, runs := slowRig(t, 2<<20, "8s", "1s")
		conn := dial()
		defer conn.Close()
		start := time.Now()
		resp, _ := askBig(t, conn)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("first answer %d", resp.StatusCode)
		}
		ev := settled(t, events)
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("the key was settled after %v (fake time), want client_write_timeout, 1s", waited)
		}
		wantCompletedNotReplayable(t, r, ev, runs)
		outlastHeartbeat()
	})
}

// TestSlowReaderPastTheUpstreamDeadline: a client reads its answer just
// fast enough for no write to wait client_write_timeout, but too slowly
// to have it all by the route's upstream deadline. The upstream answered
// at once: at the deadline the proxy is waiting on the client, not on the
// upstream, so the client is cut off, the rest of the answer read, and the
// key completed as not replayable, not sent to review as an upstream that
// ran past its deadline.
func TestSlowReaderPastTheUpstreamDeadline(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, dial, events, runs := slowRig(t, 2<<20, "3s", "1s")
		conn := dial()
		defer conn.Close()
		start := time.Now()
		resp, br := askBig(t, conn)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("first answer %d", resp.StatusCode)
		}
		go func() { // 16 KiB every 400ms: each write waits under a second
			buf := make([]byte, 16<<10)
			for {
				if _, err := io.ReadFull(br, buf); err != nil {
					return
				}
				time.Sleep(400 * time.Millisecond)
			}
		}()
		ev := settled(t, events)
		if waited := time.Since(start); waited != 3*time.Second {
			t.Errorf("the key was settled after %v (fake time), want the upstream deadline, 3s", waited)
		}
		wantCompletedNotReplayable(t, r, ev, runs)
		outlastHeartbeat()
	})
}
