package idemredis

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"strings"
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

// publishes returns how many times the server at c has run PUBLISH and
// SPUBLISH, by its command statistics.
func publishes(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	info, err := c.Do(t.Context(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for line := range strings.Lines(info) {
		for _, cmd := range []string{"cmdstat_publish:calls=", "cmdstat_spublish:calls="} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				calls, _, _ := strings.Cut(rest, ",")
				v, err := strconv.ParseInt(calls, 10, 64)
				if err != nil {
					t.Fatalf("commandstats: %q: %v", line, err)
				}
				n += v
			}
		}
	}
	return n
}

// TestPublishOnlyToWaiters checks that settling a record nobody waits for
// publishes nothing, and that a subscription marks the record so that
// every later change of it publishes, through an Extend and a takeover
// (which keep the mark), for both publish commands. It runs on a server of
// its own, whose command statistics count only this test's publishes.
func TestPublishOnlyToWaiters(t *testing.T) {
	t.Parallel()
	c := singleClient(t, throwaway(t), rueidis.ClientOption{})
	for _, classic := range []bool{false, true} {
		s, err := New(c, Config{Prefix: testPrefix(), ClassicPubSub: classic})
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		before := publishes(t, c)
		for _, name := range []string{"unwatched-1", "unwatched-2"} {
			k := reserve(t, s, name, "tok", time.Minute)
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 201}}); err != nil {
				t.Fatal(err)
			}
		}
		k := reserve(t, s, "unwatched-3", "tok", time.Minute)
		if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok"}); err != nil {
			t.Fatal(err)
		}
		if n := publishes(t, c) - before; n != 0 {
			t.Fatalf("classic %v: %d publishes for records nobody waited for, want 0", classic, n)
		}

		k = reserve(t, s, "watched", "tok", time.Minute)
		ch, cancel, err := s.Subscribe(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", Lease: -time.Second}); err != nil {
			t.Fatal(err)
		}
		if err := s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "tok", NewToken: "tok-2", Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if !receive(t, ch) {
			t.Fatal("channel closed instead of notifying the takeover")
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok-2", Response: &idemstore.Response{Status: 201}}); err != nil {
			t.Fatal(err)
		}
		if !receive(t, ch) {
			t.Fatal("channel closed instead of notifying the completion")
		}
		cancel()
		if n := publishes(t, c) - before; n != 2 {
			t.Fatalf("classic %v: %d publishes, want 2 (takeover, completion)", classic, n)
		}
	}
}

// TestSubscribeToSettledRecord checks that a subscription to a record that
// is missing or no longer pending, which no script will publish for, gets
// a value at once: the record changed before the subscription could mark
// it.
func TestSubscribeToSettledRecord(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	completed := reserve(t, s, "completed", "tok", time.Minute)
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: completed, Token: "tok", Response: &idemstore.Response{Status: 201}}); err != nil {
		t.Fatal(err)
	}
	review := reserve(t, s, "review", "tok", time.Minute)
	if err := s.Escalate(ctx, idemstore.EscalateParams{Key: review, Token: "tok", Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	missing := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: "missing"}
	for _, k := range []idemstore.Key{completed, review, missing} {
		ch, cancel, err := s.Subscribe(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if !receive(t, ch) {
			t.Fatalf("%s: channel closed, want a value", k.Key)
		}
		cancel()
	}
}
