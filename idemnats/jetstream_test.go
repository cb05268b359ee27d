package idemnats_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/internal/msgchaos"
	"github.com/idem-dev/idem/internal/testenv"
)

// The tests in this file run against a real NATS server with JetStream
// (IDEM_TEST_NATS_URL): what JetStream does with the guard's Nak,
// NakWithDelay, Term and Ack is its own, and only the server can say.

// jsRig is a fresh stream on a real server, with one durable consumer.
type jsRig struct {
	js      jetstream.JetStream
	name    string // the stream's
	subject string
	cfg     jetstream.ConsumerConfig
	cons    jetstream.Consumer
}

const rigConsumer = "billing"

// newJSRig creates the stream name (a fresh one when empty) and its
// consumer with cfg (durable rigConsumer, explicit acks), deleted when the
// test ends.
func newJSRig(t *testing.T, name string, cfg jetstream.ConsumerConfig) *jsRig {
	t.Helper()
	url := testenv.Getenv(t, "IDEM_TEST_NATS_URL")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if name == "" {
		name = msgchaos.RandomName("IDEMNATS_")
	}
	cfg.Durable, cfg.AckPolicy = rigConsumer, jetstream.AckExplicitPolicy
	r := &jsRig{js: js, name: name, subject: msgchaos.RandomName("idemnats.") + ".in", cfg: cfg}
	r.create(t)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return r
}

// create creates the stream and its consumer (again, after recreate).
func (r *jsRig) create(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	stream, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: r.name, Subjects: []string{r.subject}})
	if err != nil {
		t.Fatal(err)
	}
	if r.cons, err = stream.CreateOrUpdateConsumer(ctx, r.cfg); err != nil {
		t.Fatal(err)
	}
}

// recreate deletes the stream and creates it again, empty: its sequences
// start again at 1.
func (r *jsRig) recreate(t *testing.T) {
	t.Helper()
	if err := r.js.DeleteStream(context.Background(), r.name); err != nil {
		t.Fatal(err)
	}
	r.create(t)
}

// publish stores a message with data and the headers given as name, value
// pairs.
func (r *jsRig) publish(t *testing.T, data string, header ...string) {
	t.Helper()
	m := nats.NewMsg(r.subject)
	m.Data = []byte(data)
	for i := 0; i+1 < len(header); i += 2 {
		m.Header.Add(header[i], header[i+1])
	}
	if _, err := r.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// consume handles the consumer's messages through g until the test ends.
func (r *jsRig) consume(t *testing.T, g *idemnats.Guard, h idemnats.HandlerFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cc, err := r.cons.Consume(g.MessageHandler(ctx, h))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cc.Stop()
		<-cc.Closed()
	})
}

// serverGuard is a guard for the rig's server, which learns the server's
// version from its Publisher as an application's guard does.
func serverGuard(t *testing.T, e *idem.Engine, cfg idemnats.Config) *idemnats.Guard {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	g, err := idemnats.New(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// drained waits until the consumer has no message left to deliver or
// waiting for an ack: each was acked, terminated, or given up after
// MaxDeliver deliveries. (It polls: JetStream settles in its own time.)
func (r *jsRig) drained(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := r.cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute the consumer still has %d messages pending and %d waiting for an ack", info.NumPending, info.NumAckPending)
		}
		time.Sleep(100 * time.Millisecond) // polling the server, not synchronising
	}
}

// runs records what a handler ran for, by data.
type runs struct {
	mu   sync.Mutex
	data []string
}

func (r *runs) handle(_ context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
	r.mu.Lock()
	r.data = append(r.data, string(msg.Data()))
	r.mu.Unlock()
	return nil, nil
}

func (r *runs) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.data...)
}

// A consumer died mid-handler holding a message's key, and JetStream
// delivers the message again after AckWait, long before the dead
// consumer's lease expires. The deliveries that find the key in flight
// must not use up the consumer's MaxDeliver: the message is still
// delivered once the lease has expired, and a Transactional handler takes
// it over and runs it, once.
func TestJetStreamInFlightKeepsMaxDeliver(t *testing.T) {
	t.Parallel()
	const lease = 6 * time.Second
	r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: 3})
	e, _ := memEngine(t, idem.EngineConfig{})
	r.publish(t, "order 1", jetstream.MsgIDHeader, "o-1")

	// The consumer that dies: it takes delivery 1 and the key, and neither
	// acks nor settles.
	batch, err := r.cons.Fetch(1, jetstream.FetchMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() {
	}
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "MESSAGE", Operation: r.name, Body: []byte("order 1")}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := e.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: rigConsumer, Operation: r.name, Key: "o-1"},
		Fingerprint: fp, Kind: idem.Transactional, Lease: lease}); err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("the dead consumer's Begin: %v, %v", res.Outcome, err)
	}

	var got runs
	r.consume(t, serverGuard(t, e, idemnats.Config{Kind: idem.Transactional, Lease: lease}), got.handle)
	r.drained(t)
	if d := got.all(); len(d) != 1 {
		t.Fatalf("the handler ran %d times; want once, after the dead consumer's lease expired (JetStream gave up on the message after MaxDeliver in-flight deliveries)", len(d))
	}
}

// A message without a Nats-Msg-Id is keyed by its place in the stream. A
// stream deleted and created again numbers its messages from 1 again:
// its new messages are not the old ones, and must neither replay their
// answers (acked without running) nor be refused as reused keys.
func TestJetStreamStreamRecreated(t *testing.T) {
	t.Parallel()
	r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: 5 * time.Second})
	e, _ := memEngine(t, idem.EngineConfig{})
	var got runs
	g := serverGuard(t, e, idemnats.Config{})
	for _, batch := range [][]string{{"order a", "order b"}, {"order a", "order c"}} {
		for _, data := range batch {
			r.publish(t, data)
		}
		rigCtx, stop := context.WithCancel(context.Background())
		cc, err := r.cons.Consume(g.MessageHandler(rigCtx, got.handle))
		if err != nil {
			t.Fatal(err)
		}
		r.drained(t)
		stop()
		cc.Stop()
		<-cc.Closed()
		if batch[1] == "order b" {
			r.recreate(t)
		}
	}
	if d := got.all(); strings.Join(d, ",") != "order a,order b,order a,order c" {
		t.Fatalf("the handler ran for %q; want every message of both streams once", d)
	}
}

// Streams whose names would not make a key (as long as JetStream allows,
// or not ASCII): their messages without a Nats-Msg-Id still get one, and
// run.
func TestJetStreamStreamNamesOutsideKeys(t *testing.T) {
	t.Parallel()
	long := msgchaos.RandomName("L")
	for name, stream := range map[string]string{"long": long + strings.Repeat("L", 255-len(long)), "not ascii": msgchaos.RandomName("ЗАКАЗЫ_")} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newJSRig(t, stream, jetstream.ConsumerConfig{AckWait: 5 * time.Second})
			e, _ := memEngine(t, idem.EngineConfig{})
			var got runs
			r.consume(t, serverGuard(t, e, idemnats.Config{}), got.handle)
			r.publish(t, "order 1")
			r.drained(t)
			if d := got.all(); len(d) != 1 {
				t.Fatalf("the handler ran %d times; want once", len(d))
			}
		})
	}
}

// On the server: a handler that fails with Retryable is nakked and runs
// again on the redelivery; a business ID reused with another payload is
// terminated without running, and JetStream delivers it no more, whatever
// the server's version (before 2.10.4, servers ignore a Term that carries
// a reason).
func TestJetStreamRetryableAndMismatch(t *testing.T) {
	t.Parallel()
	r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: 5 * time.Second})
	e, _ := memEngine(t, idem.EngineConfig{})
	var mu sync.Mutex
	var ran []string
	h := func(_ context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, string(msg.Data()))
		if len(ran) == 1 {
			return nil, idem.Retryable(errors.New("the ledger was busy; nothing written"))
		}
		return nil, nil
	}
	var terms []string
	g := serverGuard(t, e, idemnats.Config{Publisher: r.js, Key: idemnats.HeaderKey("Order-Id"), OnOutcome: func(ev idemnats.Event) {
		if ev.Ack == "term" {
			mu.Lock()
			terms = append(terms, ev.Outcome)
			mu.Unlock()
		}
	}})
	r.consume(t, g, h)
	r.publish(t, "order 1", "Order-Id", "o-1")
	r.drained(t)
	r.publish(t, "order 1, changed", "Order-Id", "o-1")
	r.drained(t)
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(ran, ",") != "order 1,order 1" || strings.Join(terms, ",") != "mismatch" {
		t.Fatalf("ran for %q, terminated %q; want order 1 twice (Retryable, then the redelivery) and a mismatch terminated", ran, terms)
	}
}

// A consumer whose context ends mid-handler (its service shutting down):
// a handler that says nothing happened (Retryable) has its message nakked,
// and the next consumer runs it once; one that returns the context's error
// from an External operation has an unknown outcome, so its key goes to
// review and the message is terminated, never run again.
func TestJetStreamConsumerStoppedMidHandler(t *testing.T) {
	t.Parallel()
	for _, retryable := range []bool{true, false} {
		r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: 5 * time.Second})
		e, _ := memEngine(t, idem.EngineConfig{})
		g := serverGuard(t, e, idemnats.Config{Publisher: r.js})
		started := make(chan struct{})
		var runs, done atomic.Int32
		h := func(ctx context.Context, _ jetstream.Msg) ([]*nats.Msg, error) {
			if runs.Add(1) == 1 {
				close(started)
				<-ctx.Done() // the first run waits for its consumer to stop
				if retryable {
					return nil, idem.Retryable(ctx.Err())
				}
				return nil, ctx.Err()
			}
			done.Add(1)
			return nil, nil
		}
		ctx, stop := context.WithCancel(context.Background())
		cc, err := r.cons.Consume(g.MessageHandler(ctx, h))
		if err != nil {
			t.Fatal(err)
		}
		r.publish(t, "order 1", jetstream.MsgIDHeader, "o-1")
		<-started
		stop()
		cc.Drain()
		<-cc.Closed()
		r.consume(t, g, h) // the next consumer
		r.drained(t)
		if want := map[bool]int32{true: 1, false: 0}[retryable]; done.Load() != want || runs.Load() != 1+want {
			t.Fatalf("retryable %v: %d runs, the work done %d times; want it done %d times", retryable, runs.Load(), done.Load(), want)
		}
	}
}

// A handler that runs longer than the consumer's AckWait, with InProgress
// too rare to hold the message (InProgressInterval above AckWait, a
// misconfiguration): JetStream delivers the message to another consumer
// while the first still runs. That delivery finds the key in flight and is
// nakked, never run; the first run acks the message, and it is done once.
func TestJetStreamAckWaitShorterThanHandler(t *testing.T) {
	t.Parallel()
	r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: time.Second})
	e, _ := memEngine(t, idem.EngineConfig{})
	inFlight := make(chan struct{})
	var once sync.Once
	var runs atomic.Int32
	h := func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
		runs.Add(1)
		<-inFlight // until another consumer got the message meanwhile
		return nil, nil
	}
	cfg := idemnats.Config{InProgressInterval: time.Hour, OnOutcome: func(ev idemnats.Event) {
		if ev.Outcome == idem.SituationInFlight.Name {
			once.Do(func() { close(inFlight) })
		}
	}}
	r.publish(t, "order 1", jetstream.MsgIDHeader, "o-1")
	batch, err := r.cons.Fetch(1, jetstream.FetchMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	first := <-batch.Messages()
	g := serverGuard(t, e, cfg)
	done := make(chan error)
	go func() { done <- g.Handle(context.Background(), first, h) }()
	r.consume(t, serverGuard(t, e, cfg), h) // the other consumer
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.drained(t)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
}

// A guard remembers the messages it terminated by their place in the
// stream. A stream deleted and created again numbers its messages from 1
// again: its new message at a terminated message's sequence is another
// message, and runs; it is not terminated unhandled as the old one's
// redelivery.
func TestJetStreamStreamRecreatedAfterTerm(t *testing.T) {
	t.Parallel()
	r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: 5 * time.Second})
	e, _ := memEngine(t, idem.EngineConfig{})
	var got runs
	g := serverGuard(t, e, idemnats.Config{Key: idemnats.HeaderKey("Order-Id")})
	for i, data := range []string{"no order id", "order 1"} {
		if i == 0 {
			r.publish(t, data) // no Order-Id: terminated
		} else {
			r.publish(t, data, "Order-Id", "o-1")
		}
		rigCtx, stop := context.WithCancel(context.Background())
		cc, err := r.cons.Consume(g.MessageHandler(rigCtx, got.handle))
		if err != nil {
			t.Fatal(err)
		}
		r.drained(t)
		stop()
		cc.Stop()
		<-cc.Closed()
		if i == 0 {
			r.recreate(t)
		}
	}
	if d := got.all(); strings.Join(d, ",") != "order 1" {
		t.Fatalf("the handler ran for %q; want the new stream's message, once", d)
	}
}

// A Nats-Msg-Id that idem cannot keep is keyed by its digest,
// "nats-msg-id-sha256:<hex>". Another message whose Nats-Msg-Id is that
// very text is another message for JetStream (which stores both): it runs
// too, and is not acked unhandled as a replay of the first.
func TestJetStreamDigestKeyNotForged(t *testing.T) {
	t.Parallel()
	r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: 5 * time.Second})
	e, _ := memEngine(t, idem.EngineConfig{})
	var got runs
	r.consume(t, serverGuard(t, e, idemnats.Config{}), got.handle)
	sum := sha256.Sum256([]byte("order 1"))
	r.publish(t, "order", jetstream.MsgIDHeader, "order 1")
	r.publish(t, "order", jetstream.MsgIDHeader, "nats-msg-id-sha256:"+hex.EncodeToString(sum[:]))
	r.drained(t)
	if d := got.all(); len(d) != 2 {
		t.Fatalf("the handler ran %d times; want twice, once per message JetStream stored", len(d))
	}
}

// A handler that publishes one event to two streams under one Nats-Msg-Id
// (JetStream dedupes within a stream, not across streams): both are
// stored, and the message is acked; neither is held back as a duplicate.
func TestJetStreamOneIDTwoStreams(t *testing.T) {
	t.Parallel()
	r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: 5 * time.Second})
	e, _ := memEngine(t, idem.EngineConfig{})
	var outs [2]string
	for i := range outs {
		name := msgchaos.RandomName("IDEMNATS_OUT_")
		outs[i] = msgchaos.RandomName("idemnats.") + ".out"
		if _, err := r.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{outs[i]}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.js.DeleteStream(context.Background(), name) })
	}
	var got runs
	results := make(chan error, 1)
	g := serverGuard(t, e, idemnats.Config{Publisher: r.js})
	rigCtx, stop := context.WithCancel(context.Background())
	defer stop()
	cc, err := r.cons.Consume(func(msg jetstream.Msg) {
		results <- g.Handle(rigCtx, msg, func(ctx context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
			_, _ = got.handle(ctx, msg)
			id := nats.Header{jetstream.MsgIDHeader: {"evt-1"}}
			return []*nats.Msg{{Subject: outs[0], Header: id}, {Subject: outs[1], Header: id}}, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cc.Stop(); <-cc.Closed() }()
	r.publish(t, "order 1")
	if err := <-results; err != nil {
		t.Fatalf("the message: %v", err)
	}
	for _, subject := range outs {
		name, err := r.js.StreamNameBySubject(context.Background(), subject)
		if err != nil {
			t.Fatal(err)
		}
		s, err := r.js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if n := s.CachedInfo().State.Msgs; n != 1 {
			t.Errorf("stream %s holds %d messages; want the event", name, n)
		}
	}
	if d := got.all(); len(d) != 1 {
		t.Fatalf("the handler ran %d times", len(d))
	}
}

// With a business key, the default operation names the subject. A
// subject that JetStream accepts but a store cannot keep in an operation
// (not UTF-8, a NUL, over idem.MaxOperationLength with the stream's name)
// is named by its digest: its message runs once, and is neither nakked as
// a store failure forever (PostgreSQL refuses such text) nor terminated
// unhandled as a key too long.
func TestJetStreamSubjectsOutsideOperations(t *testing.T) {
	t.Parallel()
	db := msgchaos.NewDB(t)
	store, err := idempg.New(db.Pool, idempg.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	r := newJSRig(t, "", jetstream.ConsumerConfig{AckWait: 5 * time.Second})
	name, base := msgchaos.RandomName("IDEMNATS_WILD_"), msgchaos.RandomName("idemnats.")
	stream, err := r.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{base + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.js.DeleteStream(context.Background(), name) })
	if r.cons, err = stream.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{Durable: rigConsumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	g := serverGuard(t, e, idemnats.Config{Key: idemnats.HeaderKey("Order-Id")})
	for _, subject := range []string{base + ".\xff", base + ".a\x00b", base + "." + strings.Repeat("s", idem.MaxOperationLength)} {
		for delivery := range 2 { // the second: published again, with the same Order-Id
			m := nats.NewMsg(subject)
			m.Header.Set("Order-Id", "1")
			if _, err := r.js.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			batch, err := r.cons.Fetch(1, jetstream.FetchMaxWait(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			var got runs
			for msg := range batch.Messages() {
				if err := g.Handle(context.Background(), msg, got.handle); err != nil {
					t.Fatalf("%.40q, delivery %d: %v", subject, delivery+1, err)
				}
			}
			if want := 1 - delivery; len(got.all()) != want {
				t.Fatalf("%.40q, delivery %d: %d runs, want %d", subject, delivery+1, len(got.all()), want)
			}
		}
	}
}
