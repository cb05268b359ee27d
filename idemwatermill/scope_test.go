package idemwatermill_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemwatermill"
)

// tenantScope reads the tenant from the message's metadata.
func tenantScope(msg *message.Message) (string, error) { return msg.Metadata.Get("tenant"), nil }

// With a business key, each tenant's messages are scoped apart: tenant B's
// order that carries tenant A's order ID runs, and emits its own answer,
// not A's. A message without a tenant is poison (scope_missing); a
// ScopeFunc failure marked Retryable is not.
func TestScopeFuncKeepsTenantsApart(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	lookups := atomic.Int32{}
	h := protect(t, e, idemwatermill.Config{Scope: "billing", Key: idemwatermill.MetadataKey("order_id"), NackDelay: -1,
		ScopeFunc: func(msg *message.Message) (string, error) {
			if msg.Metadata.Get("tenant") == "down" {
				lookups.Add(1)
				return "", idem.Retryable(errors.New("the tenant directory timed out"))
			}
			return tenantScope(msg)
		}}, c.handle)
	a, err := h(delivery("a-1", "order 1", "order_id", "1", "tenant", "a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := h(delivery("b-1", "order 1", "order_id", "1", "tenant", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if c.runs.Load() != 2 || a[0].UUID == b[0].UUID {
		t.Fatalf("%d runs; A emitted %s, B %s", c.runs.Load(), a[0].UUID, b[0].UUID)
	}
	again, err := h(delivery("b-1", "order 1", "order_id", "1", "tenant", "b"))
	if err != nil || c.runs.Load() != 2 || again[0].UUID != b[0].UUID {
		t.Fatalf("B's redelivery: %v, %d runs", err, c.runs.Load())
	}
	if _, err := h(delivery("c-1", "order 1", "order_id", "1")); !errors.Is(err, idem.ErrScopeMissing) || !idemwatermill.IsPoison(err) {
		t.Fatalf("no tenant: %v", err)
	}
	if _, err := h(delivery("e-1", "order 1", "order_id", "1", "tenant", "a\x00b")); !errors.Is(err, idem.ErrScopeMissing) || !idemwatermill.IsPoison(err) {
		t.Fatalf("a control character: %v", err)
	}
	if _, err := h(delivery("d-1", "order 1", "order_id", "1", "tenant", "down")); err == nil || idemwatermill.IsPoison(err) || lookups.Load() != 1 {
		t.Fatalf("a failed lookup: %v", err)
	}
	if c.runs.Load() != 2 {
		t.Fatalf("%d runs", c.runs.Load())
	}
}

// Produced messages are copied before they are given UUIDs: a template
// message that every run returns does not carry the first run's UUID into
// the next runs (a consumer deduping by UUID would drop them all), and the
// handler's message is left as it was. Two produced messages with one UUID
// would lose one downstream: the key goes to review.
func TestProducedMessagesCopied(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	template := message.NewMessage("", []byte("receipt"))
	template.Metadata.Set("kind", "receipt")
	h := protect(t, e, idemwatermill.Config{Scope: "billing"}, func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{template}, nil
	})
	first, err := h(delivery("m-1", "x"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := h(delivery("m-2", "y"))
	if err != nil {
		t.Fatal(err)
	}
	if first[0].UUID == "" || first[0].UUID == second[0].UUID || template.UUID != "" {
		t.Fatalf("UUIDs %q and %q; the template's %q", first[0].UUID, second[0].UUID, template.UUID)
	}

	var rv reviews
	e, _ = memEngine(t, idem.EngineConfig{OnReview: rv.onReview})
	twice := protect(t, e, idemwatermill.Config{Scope: "billing", Kind: idem.Transactional}, func(*message.Message) ([]*message.Message, error) {
		m := message.NewMessage("receipt-1", nil)
		return []*message.Message{m, m}, nil
	})
	if _, err := twice(delivery("m-1", "x")); !errors.Is(err, idemwatermill.ErrDuplicateUUID) || !idemwatermill.IsPoison(err) || rv.count() != 1 {
		t.Fatalf("%v, %d reviews", err, rv.count())
	}
}

// twoRouters runs the handler "ledger" in two routers, on topics a and b of
// one GoChannel, through one engine and one configuration; each delivery's
// result goes to its rig.
func twoRouters(t *testing.T, e *idem.Engine, cfg idemwatermill.Config, a, b string, h message.HandlerFunc) (*routerRig, *routerRig) {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	mw := []message.HandlerMiddleware{idemwatermill.Middleware(e, cfg)}
	return newRouterOn(t, ps, ps, a, a+".out", mw, h), newRouterOn(t, ps, ps, b, b+".out", mw, h)
}

// With a business key, the topic is part of the default operation: an
// order created and then cancelled, with one order ID and the same
// payload, runs both handlers, even under one handler name.
func TestBusinessKeyNamesTheTopic(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	created, cancelled := twoRouters(t, e, idemwatermill.Config{Scope: "billing", Key: idemwatermill.MetadataKey("order_id")}, "orders.created", "orders.cancelled", c.handle)
	created.publish(t, delivery(watermill.NewUUID(), "order 1", "order_id", "1"))
	if err := created.next(t); err != nil {
		t.Fatal(err)
	}
	cancelled.publish(t, delivery(watermill.NewUUID(), "order 1", "order_id", "1"))
	if err := cancelled.next(t); err != nil {
		t.Fatal(err)
	}
	if c.runs.Load() != 2 {
		t.Fatalf("%d runs; the cancellation did not run", c.runs.Load())
	}
}

// A record stored before the topic was part of a business key's default
// operation (under the handler's name alone) keeps its meaning: its
// message, delivered again, replays instead of running; a record of
// another topic under that name is another event type's, and does not
// stop this one. SkipFormerKeys turns the lookup off.
func TestFormerOperationKeepsItsRecords(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	// What idem stored before, for an order created under "ledger".
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "MESSAGE", Operation: "ledger", Body: []byte("order 1")}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: "billing", Operation: "ledger", Key: "1"}, Fingerprint: fp,
		Info: &idemstore.Request{Method: "MESSAGE", Path: "orders.created"}})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := idemwatermill.Answer([]*message.Message{message.NewMessage("receipt-1", nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Lease.Complete(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
	var c counting
	created, cancelled := twoRouters(t, e, idemwatermill.Config{Scope: "billing", Key: idemwatermill.MetadataKey("order_id")}, "orders.created", "orders.cancelled", c.handle)
	created.publish(t, delivery(watermill.NewUUID(), "order 1", "order_id", "1"))
	if err := created.next(t); err != nil || c.runs.Load() != 0 {
		t.Fatalf("the redelivery across the upgrade: %v, %d runs", err, c.runs.Load())
	}
	cancelled.publish(t, delivery(watermill.NewUUID(), "order 1", "order_id", "1"))
	if err := cancelled.next(t); err != nil || c.runs.Load() != 1 {
		t.Fatalf("the cancellation: %v, %d runs", err, c.runs.Load())
	}

	var skipped counting
	created, _ = twoRouters(t, e, idemwatermill.Config{Scope: "billing", Key: idemwatermill.MetadataKey("order_id"), SkipFormerKeys: true}, "orders.created", "orders.other", skipped.handle)
	created.publish(t, delivery(watermill.NewUUID(), "order 1", "order_id", "1"))
	if err := created.next(t); err != nil || skipped.runs.Load() != 1 {
		t.Fatalf("SkipFormerKeys: %v, %d runs", err, skipped.runs.Load())
	}
}

// Two services consume one fan-out topic through one idem store, each
// router's handler named after the topic: a Config without a Scope is
// refused, and with a Scope each service runs and emits its own result.
func TestTwoServicesOneTopic(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	if _, err := idemwatermill.New(e, idemwatermill.Config{}); err == nil {
		t.Fatal("a Config without a Scope was accepted")
	}
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	var billing, shipping counting
	b := newRouterOn(t, ps, ps, "orders", "billing.out", []message.HandlerMiddleware{idemwatermill.Middleware(e, idemwatermill.Config{Scope: "billing"})}, billing.handle)
	s := newRouterOn(t, ps, ps, "orders", "shipping.out", []message.HandlerMiddleware{idemwatermill.Middleware(e, idemwatermill.Config{Scope: "shipping"})}, shipping.handle)
	b.publish(t, message.NewMessage("order-1", []byte("x")))
	if err := b.next(t); err != nil {
		t.Fatal(err)
	}
	if err := s.next(t); err != nil {
		t.Fatal(err)
	}
	if billing.runs.Load() != 1 || shipping.runs.Load() != 1 {
		t.Fatalf("billing ran %d times, shipping %d", billing.runs.Load(), shipping.runs.Load())
	}
}

// With KeyOptional, a message without a key runs unprotected: no record
// is kept, so its scope does not matter, and a ScopeFunc that finds no
// tenant (or fails) does not make it poison.
func TestKeyOptionalWithScopeFunc(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	h := protect(t, e, idemwatermill.Config{Scope: "billing", Key: idemwatermill.MetadataKey("order_id"), KeyOptional: true, ScopeFunc: tenantScope}, c.handle)
	if _, err := h(delivery("n-1", "ping")); err != nil || c.runs.Load() != 1 {
		t.Fatalf("no key, no tenant: %v, %d runs", err, c.runs.Load())
	}
	if _, err := h(delivery("n-2", "order 1", "order_id", "1")); !errors.Is(err, idem.ErrScopeMissing) || c.runs.Load() != 1 {
		t.Fatalf("a key, no tenant: %v, %d runs", err, c.runs.Load())
	}
}

// With a business key, the default operation names the topic. A topic
// that would make the operation longer than idem.MaxOperationLength, or
// that a store cannot keep (not UTF-8, a NUL), is named by its digest: its
// message runs once, and is not refused as poison (a key too long) nor
// nacked forever as a store failure.
func TestTopicsOutsideOperations(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	long, odd := "orders."+strings.Repeat("s", idem.MaxOperationLength), "orders.\xff\x00"
	a, b := twoRouters(t, e, idemwatermill.Config{Scope: "billing", Key: idemwatermill.MetadataKey("order_id")}, long, odd, c.handle)
	for i, rig := range []*routerRig{a, b, a, b} {
		rig.publish(t, delivery(watermill.NewUUID(), "order 1", "order_id", "1"))
		if err := rig.next(t); err != nil || c.runs.Load() != int32(min(i+1, 2)) {
			t.Fatalf("delivery %d: %v, %d runs", i+1, err, c.runs.Load())
		}
	}
}
