package idemnats_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
)

// dedupingPublisher acknowledges publications as JetStream does: a
// Nats-Msg-Id it stored before gets a PubAck with Duplicate set, and the
// message is not stored again.
type dedupingPublisher struct {
	jetstream.Publisher // nil: only PublishMsg is used
	mu                  sync.Mutex
	seen                map[string]bool
	stored              []*nats.Msg
}

func (p *dedupingPublisher) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := m.Header.Get(jetstream.MsgIDHeader)
	if p.seen[id] {
		return &jetstream.PubAck{Stream: "RECEIPTS", Duplicate: true}, nil
	}
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	p.seen[id] = true
	p.stored = append(p.stored, m)
	return &jetstream.PubAck{Stream: "RECEIPTS"}, nil
}

func (p *dedupingPublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.stored)
}

// Produced messages that share a header map (one nats.Header for several,
// or a template message copied by value, reused by every run) are each
// published under an ID of their own, and JetStream stores every one; the
// handler's header maps are left as they were.
func TestSharedHeadersEachGetAnID(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var pub dedupingPublisher
	g := newGuard(t, e, idemnats.Config{Publisher: &pub})
	base := nats.Header{"Content-Type": {"application/json"}}
	template := nats.Msg{Subject: "receipts", Header: nats.Header{"Kind": {"receipt"}}}
	h := func(_ context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
		a, b := template, template // copies by value share template.Header
		a.Data, b.Data = []byte("a"), []byte("b")
		return []*nats.Msg{
			{Subject: "receipts", Header: base, Data: msg.Data()},
			{Subject: "audit", Header: base, Data: msg.Data()},
			&a, &b,
		}, nil
	}
	for seq := uint64(1); seq <= 2; seq++ {
		m := newMsg(seq, "order")
		if err := g.Handle(context.Background(), m, h); err != nil || m.ack(t) != "ack" {
			t.Fatalf("message %d: %v, %q", seq, err, m.ack(t))
		}
	}
	if n := pub.count(); n != 8 {
		t.Fatalf("JetStream stored %d of the 8 produced messages", n)
	}
	if base.Get(jetstream.MsgIDHeader) != "" || template.Header.Get(jetstream.MsgIDHeader) != "" {
		t.Fatalf("the handler's headers were written to: %v, %v", base, template.Header)
	}
}

// A handler that gives two produced messages one Nats-Msg-Id would lose
// the second: its key goes to review with the reason before anything is
// published, and the message is terminated.
func TestTwoProducedMessagesWithOneIDGoToReview(t *testing.T) {
	t.Parallel()
	var (
		mu sync.Mutex
		rv []string
	)
	e, _ := memEngine(t, idem.EngineConfig{OnReview: func(_ context.Context, _ idem.Key, reason string) {
		mu.Lock()
		rv = append(rv, reason)
		mu.Unlock()
	}})
	var pub dedupingPublisher
	g := newGuard(t, e, idemnats.Config{Publisher: &pub, Kind: idem.Transactional})
	h := func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
		id := nats.Header{jetstream.MsgIDHeader: {"receipt-1"}}
		return []*nats.Msg{{Subject: "receipts", Header: id}, {Subject: "receipts", Header: id}}, nil
	}
	m := newMsg(1, "order")
	err := g.Handle(context.Background(), m, h)
	if !errors.Is(err, idemnats.ErrDuplicateID) || !idemnats.IsTerminated(err) || !strings.HasPrefix(m.ack(t), "term: ") || pub.count() != 0 {
		t.Fatalf("%v, %q, %d published", err, m.ack(t), pub.count())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rv) != 1 || !strings.Contains(rv[0], "Nats-Msg-Id") {
		t.Fatalf("review: %q", rv)
	}
}

// A produced message that JetStream drops as a duplicate at its first
// publication (its ID was used by another publication) is lost: the
// message is not acked but terminated with the reason, after the other
// produced messages are published; a later delivery is terminated again.
// A redelivery that publishes a stored answer again gets duplicates too,
// and those are the dedupe at work: it is acked.
func TestDuplicatePubAck(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var pub dedupingPublisher
	if _, err := pub.PublishMsg(context.Background(), &nats.Msg{Subject: "receipts", Header: nats.Header{jetstream.MsgIDHeader: {"receipt-1"}}}); err != nil {
		t.Fatal(err)
	}
	g := newGuard(t, e, idemnats.Config{Publisher: &pub})
	var c counting
	h := func(ctx context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
		out, err := c.handle(ctx, msg)
		if string(msg.Data()) == "collides" {
			out = append(out, &nats.Msg{Subject: "receipts", Header: nats.Header{jetstream.MsgIDHeader: {"receipt-1"}}})
		}
		return out, err
	}
	m := newMsg(1, "collides")
	err := g.Handle(context.Background(), m, h)
	if !errors.Is(err, idemnats.ErrDuplicateID) || !idemnats.IsTerminated(err) || !strings.Contains(m.ack(t), "duplicate") || pub.count() != 2 {
		t.Fatalf("first publication: %v, %q, %d stored", err, m.ack(t), pub.count())
	}
	m = newMsg(1, "collides")
	m.md.NumDelivered = 2 // the Term was ignored
	if err := g.Handle(context.Background(), m, h); !errors.Is(err, idemnats.ErrTerminatedBefore) || m.ack(t) != "term" {
		t.Fatalf("delivered again: %v, %q", err, m.ack(t))
	}

	m = newMsg(2, "fine")
	m.md.NumDelivered = 1
	if err := g.Handle(context.Background(), m, h); err != nil || m.ack(t) != "ack" {
		t.Fatalf("%v, %q", err, m.ack(t))
	}
	m = newMsg(2, "fine") // the ack was lost
	m.md.NumDelivered = 2
	if err := g.Handle(context.Background(), m, h); err != nil || m.ack(t) != "ack" || c.runs.Load() != 2 || pub.count() != 3 {
		t.Fatalf("redelivery: %v, %q, %d runs, %d stored", err, m.ack(t), c.runs.Load(), pub.count())
	}
}

// A consumer leader older than 2.10.4 ignores a Term with a reason, while
// the guard, connected to a newer server during a rolling upgrade, sends
// one: the message comes back. The guard terminates it again, plainly,
// without looking it up or running anything; another consumer, which did
// not terminate it, sends a plain Term on any delivery after the first.
func TestTerminatedMessageComesBack(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	g := newGuard(t, e, idemnats.Config{Key: idemnats.HeaderKey("Order-Id")}) // connected to 2.11
	var c counting
	m := newMsg(1, "x") // no Order-Id: terminated
	m.md.NumDelivered = 1
	if err := g.Handle(context.Background(), m, c.handle); !idemnats.IsTerminated(err) || !strings.HasPrefix(m.ack(t), "term: ") {
		t.Fatalf("%v, %q", err, m.ack(t))
	}
	for n := uint64(2); n <= 4; n++ { // the leader ignored it, each time
		m = newMsg(1, "x")
		m.md.NumDelivered = n
		if err := g.Handle(context.Background(), m, c.handle); !errors.Is(err, idemnats.ErrTerminatedBefore) || m.ack(t) != "term" || c.runs.Load() != 0 {
			t.Fatalf("delivery %d: %v, %q", n, err, m.ack(t))
		}
	}
	other := newGuard(t, e, idemnats.Config{Key: idemnats.HeaderKey("Order-Id")})
	m = newMsg(1, "x")
	m.md.NumDelivered = 5
	if err := other.Handle(context.Background(), m, c.handle); !errors.Is(err, idem.ErrMissingKey) || m.ack(t) != "term" {
		t.Fatalf("another consumer: %v, %q", err, m.ack(t))
	}
}
