package idemredis

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// notifyWait bounds how long a test waits for a notification or for a
// channel to close. It guards against hanging, not a latency requirement.
const notifyWait = 10 * time.Second

// receive waits for a value or the close of ch and reports which came.
func receive(t *testing.T, ch <-chan struct{}) (open bool) {
	t.Helper()
	select {
	case _, open = <-ch:
		return open
	case <-time.After(notifyWait):
		t.Fatalf("nothing on the channel within %v", notifyWait)
		return false
	}
}

// TestNotifyClassicPubSub checks PUBLISH/SUBSCRIBE (Config.ClassicPubSub)
// on a single node and on the Cluster, where classic messages reach every
// node.
func TestNotifyClassicPubSub(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name   string
		client func(testing.TB) rueidis.Client
	}{{"standalone", standaloneClient}, {"cluster", clusterClient}} {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			s.cfg.ClassicPubSub = true
			k := reserve(t, s, "classic", "tok", time.Minute)
			ch, cancel, err := s.Subscribe(t.Context(), k)
			if err != nil {
				t.Fatal(err)
			}
			defer cancel()
			if err := s.Complete(t.Context(), idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 201}}); err != nil {
				t.Fatal(err)
			}
			if !receive(t, ch) {
				t.Fatal("channel closed instead of notifying")
			}
		})
	}
}

// TestSubscribeEnds checks each way a subscription ends: a lost
// connection and the end of ctx close the channel; a cancelled ctx fails
// Subscribe; cancel is safe after all of them and twice. TestMain's leak
// check fails the run if a subscription's goroutine outlives it.
func TestSubscribeEnds(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	opt := rueidis.MustParseURL(requireEnv(t, "IDEM_TEST_REDIS_URL"))
	opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	s := newTestStore(t, newClient(t, opt))
	k := reserve(t, s, "ends", "tok", time.Minute)

	t.Run("connection lost", func(t *testing.T) {
		ch, cancel, err := s.Subscribe(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		if receive(t, ch) {
			t.Fatal("a notification came, want the channel closed")
		}
		cancel()
	})
	t.Run("ctx ends", func(t *testing.T) {
		ctx, stop := context.WithCancel(t.Context())
		ch, cancel, err := s.Subscribe(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		stop()
		if receive(t, ch) {
			t.Fatal("a notification came, want the channel closed")
		}
	})
	t.Run("ctx cancelled before", func(t *testing.T) {
		ctx, stop := context.WithCancel(t.Context())
		stop()
		if _, _, err := s.Subscribe(ctx, k); !errors.Is(err, context.Canceled) {
			t.Fatalf("Subscribe with a cancelled ctx: %v, want context.Canceled", err)
		}
	})
	t.Run("notified after a reconnection", func(t *testing.T) {
		// The store's own connections were cut above: the next
		// subscription and change go over new ones.
		ch, cancel, err := s.Subscribe(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		if err := s.Extend(t.Context(), idemstore.ExtendParams{Key: k, Token: "tok", Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(t.Context(), idemstore.ReleaseParams{Key: k, Token: "tok"}); err != nil {
			t.Fatal(err)
		}
		if !receive(t, ch) {
			t.Fatal("channel closed instead of notifying")
		}
	})
}
