package idemwatermill_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemwatermill"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(chaosChild(role))
	}
	// Watermill's Deduplicator (compared against in one test) starts a
	// cleaning goroutine that nothing stops.
	os.Exit(testenv.VerifyNoLeaks(m, testenv.LeakGrace,
		goleak.IgnoreTopFunction("github.com/ThreeDotsLabs/watermill/message/router/middleware.(*mapExpiringKeyRepository).cleanOutLoop")))
}

var discard = slog.New(slog.DiscardHandler)

// memEngine is an engine over a fresh memory store.
func memEngine(t testing.TB, cfg idem.EngineConfig) (*idem.Engine, *idemmem.Store) {
	t.Helper()
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	e, err := idem.NewEngine(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, store
}

// protect wraps h in the middleware.
func protect(t testing.TB, e *idem.Engine, cfg idemwatermill.Config, h message.HandlerFunc) message.HandlerFunc {
	t.Helper()
	mw, err := idemwatermill.New(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw(h)
}

// delivery is a fresh delivery of the message uuid with payload, as a
// subscriber hands it over (every delivery is a new *message.Message).
func delivery(uuid, payload string, meta ...string) *message.Message {
	m := message.NewMessage(uuid, []byte(payload))
	for i := 0; i+1 < len(meta); i += 2 {
		m.Metadata.Set(meta[i], meta[i+1])
	}
	return m
}

// counting is a handler that counts its runs and produces one message per
// run, with a UUID of its own.
type counting struct {
	runs atomic.Int32
	fail func(run int32, msg *message.Message) error
}

func (c *counting) handle(msg *message.Message) ([]*message.Message, error) {
	n := c.runs.Add(1)
	if c.fail != nil {
		if err := c.fail(n, msg); err != nil {
			return nil, err
		}
	}
	out := message.NewMessage(fmt.Sprintf("out-%s-%d", msg.UUID, n), append([]byte("handled:"), msg.Payload...))
	out.Metadata.Set("run", fmt.Sprint(n))
	return []*message.Message{out}, nil
}

// reviews collects the keys OnReview is told of.
type reviews struct {
	mu      sync.Mutex
	reasons []string
}

func (r *reviews) onReview(_ context.Context, _ idem.Key, reason string) {
	r.mu.Lock()
	r.reasons = append(r.reasons, reason)
	r.mu.Unlock()
}

func (r *reviews) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reasons)
}
