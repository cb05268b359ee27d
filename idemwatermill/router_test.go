package idemwatermill_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemwatermill"
	"github.com/idem-dev/idem/internal/msgchaos"
	"github.com/idem-dev/idem/internal/testenv"
)

// routerRig is a Watermill router whose handler "ledger" consumes a topic
// and publishes to another: on an in-process GoChannel pub/sub, or on a
// real broker.
type routerRig struct {
	pubsub  *gochannel.GoChannel // nil on a real broker
	pub     message.Publisher
	sub     message.Subscriber
	router  *message.Router
	in, out string
	handled chan error // each delivery's result, as the router sees it
}

// newRouter is a rig on a GoChannel pub/sub: the handler consumes
// "orders" and publishes to "receipts".
func newRouter(t *testing.T, mws func(*gochannel.GoChannel) []message.HandlerMiddleware, h message.HandlerFunc) *routerRig {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	var m []message.HandlerMiddleware
	if mws != nil {
		m = mws(ps)
	}
	rig := newRouterOn(t, ps, ps, "orders", "receipts", m, h)
	rig.pubsub = ps
	return rig
}

// keepOpen is a publisher the router cannot close. Watermill's router
// closes a handler's publisher when the handler stops, without waiting for
// the handler's deliveries still publishing what they produced, and a
// GoChannel shared by several handlers would be closed under the others.
// Whoever made the publisher closes it, after the router has stopped.
type keepOpen struct{ message.Publisher }

// Close leaves the publisher open.
func (keepOpen) Close() error { return nil }

// newRouterOn is a rig on pub and sub, whose handler consumes in and
// publishes to out, through mws.
func newRouterOn(t *testing.T, pub message.Publisher, sub message.Subscriber, in, out string, mws []message.HandlerMiddleware, h message.HandlerFunc) *routerRig {
	t.Helper()
	logger := watermill.NopLogger{}
	rig := &routerRig{pub: pub, sub: sub, in: in, out: out, handled: make(chan error, 16)}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	rig.router = router
	// Outermost: report what each delivery came to.
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			rig.handled <- err
			return out, err
		}
	})
	router.AddMiddleware(mws...)
	router.AddHandler("ledger", in, sub, out, keepOpen{pub}, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := router.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		router.Close()
	})
	<-router.Running()
	return rig
}

// next waits for the next delivery's result.
func (r *routerRig) next(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.handled:
		return err
	case <-time.After(time.Minute):
		t.Fatal("no delivery within a minute")
		return nil
	}
}

func (r *routerRig) publish(t *testing.T, msgs ...*message.Message) {
	t.Helper()
	if err := r.pub.Publish(r.in, msgs...); err != nil {
		t.Fatal(err)
	}
}

// Comparison with Watermill's Deduplicator: a handler fails once with an
// error that means "nothing happened, try again", and the broker delivers
// the message again (on an in-process GoChannel, and on RabbitMQ through
// watermill-amqp). The Deduplicator marked the message seen before the
// first run, so it drops the redelivery and the work is lost; idem
// released the key, so the redelivery runs and the work is done, once.
func TestComparisonDeduplicatorLosesRetriedMessage(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{"gochannel", "amqp"} {
		for _, tc := range []struct {
			name string
			mw   func(t *testing.T) message.HandlerMiddleware
			done int32
		}{
			{"watermill Deduplicator", func(*testing.T) message.HandlerMiddleware {
				return new(middleware.Deduplicator).Middleware
			}, 0},
			{"idemwatermill", func(t *testing.T) message.HandlerMiddleware {
				e, _ := memEngine(t, idem.EngineConfig{})
				mw, err := idemwatermill.New(e, idemwatermill.Config{Scope: "billing"})
				if err != nil {
					t.Fatal(err)
				}
				return mw
			}, 1},
		} {
			t.Run(broker+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				var runs, done atomic.Int32
				mw := tc.mw(t)
				h := func(*message.Message) ([]*message.Message, error) {
					if runs.Add(1) == 1 {
						return nil, idem.Retryable(errors.New("the ledger was busy; nothing written"))
					}
					done.Add(1)
					return nil, nil
				}
				var rig *routerRig
				if broker == "amqp" {
					rig = amqpRouter(t, func(message.Publisher, string) []message.HandlerMiddleware { return []message.HandlerMiddleware{mw} }, h)
				} else {
					rig = newRouter(t, func(*gochannel.GoChannel) []message.HandlerMiddleware { return []message.HandlerMiddleware{mw} }, h)
				}
				rig.publish(t, message.NewMessage(watermill.NewUUID(), []byte(`{"order":1}`)))
				if err := rig.next(t); err == nil {
					t.Fatal("the first delivery did not fail")
				}
				if err := rig.next(t); err != nil { // the redelivery, acked
					t.Fatalf("the redelivery: %v", err)
				}
				if got := done.Load(); got != tc.done {
					t.Fatalf("the work was done %d times, want %d", got, tc.done)
				}
			})
		}
	}
}

// amqpRouter is a rig on RabbitMQ (watermill-amqp, durable queues), on
// fresh queues (its topics, and in's poison queue in+"_poison") deleted
// when the test ends. mws are given the rig's publisher and input topic.
func amqpRouter(t *testing.T, mws func(pub message.Publisher, in string) []message.HandlerMiddleware, h message.HandlerFunc) *routerRig {
	t.Helper()
	in, out := chaosTopics(msgchaos.RandomName("rig_"))
	return amqpRouterOn(t, in, out, mws, h)
}

// amqpRouterOn is amqpRouter on the topics in and out: a second consumer
// of another rig's queue.
func amqpRouterOn(t *testing.T, in, out string, mws func(pub message.Publisher, in string) []message.HandlerMiddleware, h message.HandlerFunc) *routerRig {
	t.Helper()
	url := testenv.Getenv(t, "IDEM_TEST_AMQP_URL")
	cfg := amqp.NewDurableQueueConfig(url)
	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pub.Close()
		sub.Close()
		deleteQueues(t, url, in, out, in+"_poison")
	})
	for _, q := range []string{in, out, in + "_poison"} {
		if err := sub.SubscribeInitialize(q); err != nil {
			t.Fatal(err)
		}
	}
	return newRouterOn(t, pub, sub, in, out, mws(pub, in), h)
}

// Through a router: a redelivered message whose key was used with another
// payload goes to the poison queue (PoisonQueueWithFilter with IsPoison)
// with the reason, and the handler does not run; the produced messages of
// the first are published once per delivery, with the same UUID.
func TestRouterPoisonQueueAndReplay(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	rig := newRouter(t, func(ps *gochannel.GoChannel) []message.HandlerMiddleware {
		poison, err := middleware.PoisonQueueWithFilter(ps, "orders.poison", idemwatermill.IsPoison)
		if err != nil {
			t.Fatal(err)
		}
		return []message.HandlerMiddleware{poison, idemwatermill.Middleware(e, idemwatermill.Config{Scope: "billing"})}
	}, c.handle)
	receipts, err := rig.pubsub.Subscribe(context.Background(), "receipts")
	if err != nil {
		t.Fatal(err)
	}
	poisoned, err := rig.pubsub.Subscribe(context.Background(), "orders.poison")
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range []*message.Message{
		delivery("m-1", "order 1"),
		delivery("m-1", "order 1"), // delivered again: replayed
		delivery("m-1", "order 2"), // same UUID, another payload: poison
	} {
		rig.publish(t, d)
		if err := rig.next(t); err != nil {
			t.Fatalf("delivery %d: %v (the poison queue acks poison)", i+1, err)
		}
	}
	var uuids []string
	for i := 0; i < 2; i++ {
		m := <-receipts
		m.Ack()
		uuids = append(uuids, m.UUID)
	}
	if uuids[0] != uuids[1] {
		t.Fatalf("receipts %v: want the same UUID twice", uuids)
	}
	p := <-poisoned
	p.Ack()
	if string(p.Payload) != "order 2" || p.Metadata.Get(middleware.ReasonForPoisonedKey) == "" {
		t.Fatalf("poisoned %q with metadata %v", p.Payload, p.Metadata)
	}
	if c.runs.Load() != 1 {
		t.Fatalf("the handler ran %d times", c.runs.Load())
	}
}

// Two handlers consume one topic (two consumer groups) through one idem
// store with HandlerScope and the default Operation, their handlers'
// names: a message's UUID keys each handler's run separately, and neither
// gets the other's answer.
func TestTwoHandlersOneUUID(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(idemwatermill.Middleware(e, idemwatermill.Config{HandlerScope: true}))
	ran := make(chan string, 4)
	for _, name := range []string{"billing", "shipping"} {
		router.AddHandler(name, "orders", ps, name+".out", keepOpen{ps}, func(m *message.Message) ([]*message.Message, error) {
			ran <- name
			return []*message.Message{message.NewMessage(name+"-receipt", nil)}, nil
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := router.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		router.Close()
		ps.Close()
	})
	<-router.Running()
	outs := map[string]<-chan *message.Message{}
	for _, name := range []string{"billing", "shipping"} {
		if outs[name], err = ps.Subscribe(context.Background(), name+".out"); err != nil {
			t.Fatal(err)
		}
	}
	if err := ps.Publish("orders", message.NewMessage("order-1", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	for name, out := range outs { // each handler emits, having run or replayed
		select {
		case m := <-out:
			m.Ack()
			if m.UUID != name+"-receipt" {
				t.Errorf("%s emitted %s, not its own receipt", name, m.UUID)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s emitted nothing within a minute", name)
		}
	}
	if n := len(ran); n != 2 {
		t.Fatalf("%d handlers ran; want both", n)
	}
}
