package chaos_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/chaos"
)

// echoServer echoes what each connection sends and reports every chunk it
// received on the returned channel.
func echoServer(t *testing.T) (string, <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						got <- string(buf[:n])
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), got
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a bound, so a broken relay fails instead of hanging
	return c
}

// roundTrip sends msg on c and returns what came back, or the error.
func roundTrip(c net.Conn, msg string) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func receive(t *testing.T, got <-chan string) string {
	t.Helper()
	select {
	case s := <-got:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the server received nothing")
		return ""
	}
}

func TestRelayDropsReplyAfterDelivering(t *testing.T) {
	addr, got := echoServer(t)
	r, err := chaos.NewRelay(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := dial(t, r.Addr())
	if s, err := roundTrip(c, "SELECT 1"); err != nil || s != "SELECT 1" {
		t.Fatalf("before arming: %q, %v", s, err)
	}
	receive(t, got)
	r.DropNextReply([]byte("COMMIT"))
	if s, err := roundTrip(c, "SELECT 2"); err != nil || s != "SELECT 2" {
		t.Fatalf("a statement the pattern does not match: %q, %v", s, err)
	}
	receive(t, got)
	if s, err := roundTrip(c, "commit"); err == nil {
		t.Fatalf("COMMIT's reply came through: %q", s)
	}
	if s := receive(t, got); s != "commit" {
		t.Fatalf("the server received %q, want the COMMIT", s)
	}
	if st := r.Stats(); st.DroppedReplies != 1 {
		t.Fatalf("stats %+v, want one dropped reply", st)
	}
	// Disarmed: a new connection passes everything.
	c2 := dial(t, r.Addr())
	if s, err := roundTrip(c2, "COMMIT"); err != nil || s != "COMMIT" {
		t.Fatalf("after the drop: %q, %v", s, err)
	}
}

func TestRelayHalfWrite(t *testing.T) {
	addr, got := echoServer(t)
	r, err := chaos.NewRelay(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := dial(t, r.Addr())
	r.HalfWriteNext()
	if s, err := roundTrip(c, "abcdef"); err == nil {
		t.Fatalf("a half-written message was answered: %q", s)
	}
	if s := receive(t, got); s != "abc" {
		t.Fatalf("the server received %q, want the first half", s)
	}
}

func TestRelayOutage(t *testing.T) {
	addr, _ := echoServer(t)
	r, err := chaos.NewRelay(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	open := dial(t, r.Addr())
	if _, err := roundTrip(open, "x"); err != nil {
		t.Fatal(err)
	}
	r.SetDown(true)
	if _, err := roundTrip(open, "y"); err == nil {
		t.Fatal("a connection open when the outage began still works")
	}
	// A connection made during the outage is reset, at once or at its
	// first exchange.
	if refused, err := net.Dial("tcp", r.Addr()); err == nil {
		defer refused.Close()
		_ = refused.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := roundTrip(refused, "z"); err == nil {
			t.Fatal("a connection made during the outage works")
		}
	}
	r.SetDown(false)
	if s, err := roundTrip(dial(t, r.Addr()), "back"); err != nil || s != "back" {
		t.Fatalf("after the outage: %q, %v", s, err)
	}
	if st := r.Stats(); st.Outages != 1 || st.Refused < 1 || st.Cuts < 1 {
		t.Fatalf("stats %+v, want one outage, a refused connection and a cut", st)
	}
}

func TestRelayCut(t *testing.T) {
	addr, _ := echoServer(t)
	r, err := chaos.NewRelay(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := dial(t, r.Addr())
	if _, err := roundTrip(c, "x"); err != nil {
		t.Fatal(err)
	}
	if !r.CutRandom() {
		t.Fatal("CutRandom found no connection")
	}
	if _, err := roundTrip(c, "y"); err == nil {
		t.Fatal("a cut connection still works")
	}
}

func TestRelaySlowStillDelivers(t *testing.T) {
	addr, _ := echoServer(t)
	r, err := chaos.NewRelay(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.SetDelay(20 * time.Millisecond)
	r.SetDelay(30 * time.Millisecond) // still the same slow spell
	c := dial(t, r.Addr())
	for _, msg := range []string{"a", "bb", "ccc"} {
		if s, err := roundTrip(c, msg); err != nil || s != msg {
			t.Fatalf("through a slow relay: %q, %v", s, err)
		}
	}
	r.SetDelay(0)
	if st := r.Stats(); st.SlowSpells != 1 {
		t.Fatalf("stats %+v, want one slow spell", st)
	}
}
