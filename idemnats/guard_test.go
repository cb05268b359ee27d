package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(chaosChild(role))
	}
	os.Exit(testenv.VerifyNoLeaks(m, testenv.LeakGrace))
}

var discard = slog.New(slog.DiscardHandler)

// fakeMsg is a jetstream.Msg that records how it was acknowledged.
type fakeMsg struct {
	subject string
	data    []byte
	header  nats.Header
	md      jetstream.MsgMetadata

	mu   sync.Mutex
	acks []string
	wip  int
}

func newMsg(seq uint64, data string, header ...string) *fakeMsg {
	m := &fakeMsg{subject: "orders.placed", data: []byte(data),
		md: jetstream.MsgMetadata{Stream: "ORDERS", Consumer: "billing", Sequence: jetstream.SequencePair{Stream: seq}}}
	for i := 0; i+1 < len(header); i += 2 {
		if m.header == nil {
			m.header = nats.Header{}
		}
		m.header.Add(header[i], header[i+1])
	}
	return m
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { md := m.md; return &md, nil }
func (m *fakeMsg) Data() []byte                              { return m.data }
func (m *fakeMsg) Headers() nats.Header                      { return m.header }
func (m *fakeMsg) Subject() string                           { return m.subject }
func (m *fakeMsg) Reply() string                             { return "" }
func (m *fakeMsg) Ack() error                                { return m.record("ack") }
func (m *fakeMsg) DoubleAck(context.Context) error           { return m.record("ack") }
func (m *fakeMsg) Nak() error                                { return m.record("nak") }
func (m *fakeMsg) NakWithDelay(d time.Duration) error        { return m.record(fmt.Sprintf("nak %v", d)) }
func (m *fakeMsg) Term() error                               { return m.record("term") }
func (m *fakeMsg) TermWithReason(r string) error             { return m.record("term: " + r) }
func (m *fakeMsg) InProgress() error {
	m.mu.Lock()
	m.wip++
	m.mu.Unlock()
	return nil
}

func (m *fakeMsg) record(a string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.acks = append(m.acks, a)
	return nil
}

// ack is the message's one acknowledgement.
func (m *fakeMsg) ack(t *testing.T) string {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.acks) != 1 {
		t.Fatalf("acknowledged %q; want exactly once", m.acks)
	}
	return m.acks[0]
}

// publisher records what the guard publishes.
type publisher struct {
	jetstream.Publisher // nil: only PublishMsg is used
	mu                  sync.Mutex
	msgs                []*nats.Msg
	fail                atomic.Int32 // fail this many publications
}

func (p *publisher) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if p.fail.Add(-1) >= 0 {
		return nil, errors.New("nats: timeout")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, m)
	return &jetstream.PubAck{}, nil
}

func (p *publisher) ids() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, m := range p.msgs {
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids
}

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

// letHeartbeatExit lets the engine's heartbeat goroutine, idle once the
// last lease ended, exit as it does after a short linger: in a synctest
// bubble, whose goroutines must all end, sleeping moves the bubble's clock
// past that linger (no real time passes); nothing else ends it from
// outside the engine.
func letHeartbeatExit() {
	synctest.Wait()
	time.Sleep(time.Second)
}

// newGuard is a guard for fake messages, as from a server that takes a
// Term's reason (TermWithReason).
func newGuard(t testing.TB, e *idem.Engine, cfg idemnats.Config) *idemnats.Guard {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discard
	}
	g, err := idemnats.New(e, cfg)
	if err != nil {
		t.Fatal(err)
	}
	idemnats.SetServerVersion(g, "2.11.0") // a server that takes a Term's reason
	return g
}

// counting is a handler that counts its runs and produces one receipt per
// run, without a Nats-Msg-Id of its own.
type counting struct {
	runs atomic.Int32
	fail func(run int32) error
}

func (c *counting) handle(_ context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
	n := c.runs.Add(1)
	if c.fail != nil {
		if err := c.fail(n); err != nil {
			return nil, err
		}
	}
	return []*nats.Msg{{Subject: "receipts", Data: append([]byte("paid:"), msg.Data()...)}}, nil
}

// A message delivered again after its handler completed is acked without
// running the handler, and its receipt is published again with the same
// Nats-Msg-Id.
func TestRedeliveryAcksAndRepublishes(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var pub publisher
	g := newGuard(t, e, idemnats.Config{Publisher: &pub})
	var c counting
	for range 2 {
		m := newMsg(7, "order 7")
		if err := g.Handle(context.Background(), m, c.handle); err != nil {
			t.Fatal(err)
		}
		if a := m.ack(t); a != "ack" {
			t.Fatalf("acknowledged %q", a)
		}
	}
	ids := pub.ids()
	if c.runs.Load() != 1 || len(ids) != 2 || ids[0] == "" || ids[0] != ids[1] {
		t.Fatalf("%d runs, published IDs %q", c.runs.Load(), ids)
	}
}

// Keys: the Nats-Msg-Id header when present (two deliveries of one ID at
// different stream sequences run once), else stream and sequence.
func TestKeys(t *testing.T) {
	t.Parallel()
	e, store := memEngine(t, idem.EngineConfig{})
	g := newGuard(t, e, idemnats.Config{})
	h := func(context.Context, jetstream.Msg) ([]*nats.Msg, error) { return nil, nil }
	for _, m := range []*fakeMsg{newMsg(1, "a", "Nats-Msg-Id", "order-1"), newMsg(2, "a", "Nats-Msg-Id", "order-1"), newMsg(3, "b")} {
		if err := g.Handle(context.Background(), m, h); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"order-1", "ORDERS:3"} {
		if _, err := store.Get(context.Background(), idem.Key{Scope: "billing", Operation: "ORDERS", Key: key}); err != nil {
			t.Errorf("no record for %q: %v", key, err)
		}
	}
	if _, err := store.Get(context.Background(), idem.Key{Scope: "billing", Operation: "ORDERS", Key: "ORDERS:2"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("the second publication of order-1 ran under its sequence: %v", err)
	}
}

// Every Nats-Msg-Id that JetStream accepts keys its message: an empty
// one is no ID (the stream sequence keys it), of several the first counts,
// and one that is not a valid idem key (spaces, control or non-ASCII
// bytes, too long) is keyed by its digest, which a redelivery and a
// republication of the ID share; the guard logs it, without the ID.
func TestNatsMsgIDsJetStreamAccepts(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 300)
	for _, tc := range []struct {
		name   string
		header []string
		again  []string // a later delivery or republication that must replay
		other  []string // another message that must run
	}{
		{"empty", []string{"Nats-Msg-Id", ""}, nil, nil},
		{"spaced", []string{"Nats-Msg-Id", "order 1"}, []string{"Nats-Msg-Id", "order 1"}, []string{"Nats-Msg-Id", "order 2"}},
		{"non-ASCII", []string{"Nats-Msg-Id", "commande-é"}, []string{"Nats-Msg-Id", "commande-é"}, []string{"Nats-Msg-Id", "commande-è"}},
		{"control", []string{"Nats-Msg-Id", "k\r\nEvil: 1"}, []string{"Nats-Msg-Id", "k\r\nEvil: 1"}, []string{"Nats-Msg-Id", "k\r\nEvil: 2"}},
		{"too long", []string{"Nats-Msg-Id", long}, []string{"Nats-Msg-Id", long}, []string{"Nats-Msg-Id", long + "2"}},
		{"two IDs", []string{"Nats-Msg-Id", "a", "Nats-Msg-Id", "b"}, []string{"Nats-Msg-Id", "a"}, []string{"Nats-Msg-Id", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, _ := memEngine(t, idem.EngineConfig{})
			var logs testenv.Buffer
			g := newGuard(t, e, idemnats.Config{Publisher: &publisher{}, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			var c counting
			handle := func(seq uint64, header []string) {
				t.Helper()
				m := newMsg(seq, "x", header...)
				if err := g.Handle(context.Background(), m, c.handle); err != nil || m.ack(t) != "ack" {
					t.Fatalf("delivery %d: %v, %q", seq, err, m.ack(t))
				}
			}
			handle(1, tc.header)
			handle(1, tc.header) // a redelivery
			if tc.again != nil {
				handle(2, tc.again) // a republication, stored at another sequence
			}
			want := int32(1)
			if tc.other != nil {
				handle(3, tc.other)
				want = 2
			}
			if c.runs.Load() != want {
				t.Fatalf("%d runs, want %d", c.runs.Load(), want)
			}
			if tc.name != "empty" && tc.name != "two IDs" && !strings.Contains(logs.String(), "digest") {
				t.Errorf("the digest key was not logged: %s", logs.String())
			}
			if strings.Contains(logs.String(), "Evil") || strings.Contains(logs.String(), "kkkk") {
				t.Errorf("the log shows the ID: %s", logs.String())
			}
		})
	}
}

// Hostile or missing keys are terminated with a reason, and the handler
// does not run; the reason never shows the key.
func TestHostileKeysTerminate(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	for _, tc := range []struct {
		name string
		msg  *fakeMsg
		cfg  idemnats.Config
		want error
	}{
		{"too long", newMsg(1, "x", "Order-Id", strings.Repeat("k", 300)), idemnats.Config{Key: idemnats.HeaderKey("Order-Id")}, idem.ErrInvalidKey},
		{"control", newMsg(1, "x", "Order-Id", "k\r\nEvil: 1"), idemnats.Config{Key: idemnats.HeaderKey("Order-Id")}, idem.ErrInvalidKey},
		{"two IDs", newMsg(1, "x", "Order-Id", "a", "Order-Id", "b"), idemnats.Config{Key: idemnats.HeaderKey("Order-Id")}, idem.ErrInvalidKey},
		{"missing business ID", newMsg(1, "x"), idemnats.Config{Key: idemnats.HeaderKey("Order-Id")}, idem.ErrMissingKey},
	} {
		var c counting
		err := newGuard(t, e, tc.cfg).Handle(context.Background(), tc.msg, c.handle)
		a := tc.msg.ack(t)
		if !errors.Is(err, tc.want) || !idemnats.IsTerminated(err) || !strings.HasPrefix(a, "term: ") || c.runs.Load() != 0 {
			t.Errorf("%s: %v, %q, %d runs", tc.name, err, a, c.runs.Load())
		}
		if strings.Contains(a, "Evil") || strings.Contains(a, "kkkk") || strings.ContainsAny(a, "\r\n") {
			t.Errorf("%s: the reason shows the key: %q", tc.name, a)
		}
	}
}

// The same key with other data (or another value of a fingerprinted
// header) is terminated, and the handler does not run.
func TestMismatchTerminates(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	g := newGuard(t, e, idemnats.Config{FingerprintHeaders: []string{"Amount"}})
	var c counting
	h := func(ctx context.Context, m jetstream.Msg) ([]*nats.Msg, error) { c.handle(ctx, m); return nil, nil }
	if err := g.Handle(context.Background(), newMsg(1, "order", "Nats-Msg-Id", "o-1", "Amount", "10"), h); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*fakeMsg{newMsg(2, "other", "Nats-Msg-Id", "o-1", "Amount", "10"), newMsg(3, "order", "Nats-Msg-Id", "o-1", "Amount", "11")} {
		err := g.Handle(context.Background(), m, h)
		if !errors.Is(err, idem.ErrMismatch) || !strings.HasPrefix(m.ack(t), "term: ") {
			t.Fatalf("%v, %q", err, m.ack(t))
		}
	}
	if c.runs.Load() != 1 {
		t.Fatalf("%d runs", c.runs.Load())
	}
}

// Handler errors: Retryable naks (the redelivery runs again); a plain error
// of an External operation terminates with the reason and sends the key to
// review; of a Transactional one, naks.
func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		kind idem.Kind
		err  error
		ack  string
	}{
		{"retryable", idem.External, idem.Retryable(boom), "nak"},
		{"plain external", idem.External, boom, "term: idemnats: needs_review: the handler failed and its outcome is unknown: boom"},
		{"ambiguous", idem.Transactional, idem.Ambiguous(boom), "term: idemnats: needs_review: the handler failed and its outcome is unknown: boom"},
		{"plain transactional", idem.Transactional, boom, "nak"},
	} {
		e, _ := memEngine(t, idem.EngineConfig{})
		g := newGuard(t, e, idemnats.Config{Kind: tc.kind, Publisher: &publisher{}})
		c := counting{fail: func(run int32) error {
			if run == 1 {
				return tc.err
			}
			return nil
		}}
		m := newMsg(1, "x")
		if err := g.Handle(context.Background(), m, c.handle); !errors.Is(err, boom) {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if a := m.ack(t); a != tc.ack {
			t.Fatalf("%s: acknowledged %q, want %q", tc.name, a, tc.ack)
		}
		// Delivered again, to another consumer (this guard would
		// terminate a message it terminated without a lookup).
		again := newMsg(1, "x")
		err := newGuard(t, e, idemnats.Config{Kind: tc.kind, Publisher: &publisher{}}).Handle(context.Background(), again, c.handle)
		if tc.ack == "nak" && (err != nil || c.runs.Load() != 2) {
			t.Fatalf("%s: redelivery %v after %d runs", tc.name, err, c.runs.Load())
		}
		if tc.ack != "nak" && (!errors.Is(err, idem.ErrNeedsReview) || c.runs.Load() != 1 || !strings.HasPrefix(again.ack(t), "term: ")) {
			t.Fatalf("%s: redelivery %v after %d runs", tc.name, err, c.runs.Load())
		}
	}
}

// A message redelivered while its first handling runs is nakked with a
// delay (about as long as that handling has run, at most NakDelay); the
// running handler tells JetStream it is in progress at each heartbeat.
func TestInFlightAndInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := memEngine(t, idem.EngineConfig{Lease: 3 * time.Second})
		g := newGuard(t, e, idemnats.Config{NakDelay: 2 * time.Second})
		release := make(chan struct{})
		first := newMsg(1, "x")
		done := make(chan error)
		go func() {
			done <- g.Handle(context.Background(), first, func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
				<-release
				return nil, nil
			})
		}()
		time.Sleep(10*time.Second + time.Millisecond) // fake time: three leases and more
		again := newMsg(1, "x")
		err := g.Handle(context.Background(), again, func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
			t.Error("the handler ran twice")
			return nil, nil
		})
		if !errors.Is(err, idem.ErrInFlight) || idemnats.IsTerminated(err) {
			t.Fatalf("redelivery: %v", err)
		}
		if a := again.ack(t); a != "nak 2s" {
			t.Fatalf("redelivery acknowledged %q; want nak 2s (NakDelay, under RetryAfter)", a)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		first.mu.Lock()
		wip := first.wip
		first.mu.Unlock()
		if wip != 10 {
			t.Fatalf("InProgress %d times in 10s with a 3s lease; want 10 (every second)", wip)
		}
		letHeartbeatExit()
	})
}

// A failed publication of the produced messages naks the message (its key
// is completed); the redelivery publishes the stored messages, with the
// same IDs, without running the handler. A handler that produces messages
// without a Publisher is nakked the same way.
func TestPublishFailsThenReplays(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	pub := &publisher{}
	pub.fail.Store(1)
	g := newGuard(t, e, idemnats.Config{Publisher: pub, NakDelay: time.Second})
	var c counting
	m := newMsg(1, "x")
	if err := g.Handle(context.Background(), m, c.handle); err == nil || m.ack(t) != "nak 1s" {
		t.Fatalf("%v, %q", err, m.ack(t))
	}
	again := newMsg(1, "x")
	if err := g.Handle(context.Background(), again, c.handle); err != nil || again.ack(t) != "ack" {
		t.Fatalf("%v, %q", err, again.ack(t))
	}
	if c.runs.Load() != 1 || len(pub.ids()) != 1 {
		t.Fatalf("%d runs, published %q", c.runs.Load(), pub.ids())
	}

	noPub := newGuard(t, e, idemnats.Config{NakDelay: time.Second})
	m = newMsg(2, "y")
	if err := noPub.Handle(context.Background(), m, c.handle); err == nil || m.ack(t) != "nak 1s" {
		t.Fatalf("without a Publisher: %v, %q", err, m.ack(t))
	}
}

// A store that is down: the handler does not run, and the message is
// nakked with a delay.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	_, mem := memEngine(t, idem.EngineConfig{})
	e, err := idem.NewEngine(downStore{mem}, idem.EngineConfig{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	var c counting
	m := newMsg(1, "x")
	err = newGuard(t, e, idemnats.Config{}).Handle(context.Background(), m, c.handle)
	if !errors.Is(err, idemstore.ErrUnavailable) || idemnats.IsTerminated(err) || m.ack(t) != "nak 5s" || c.runs.Load() != 0 {
		t.Fatalf("%v, %q, %d runs", err, m.ack(t), c.runs.Load())
	}
}

type downStore struct{ idemstore.Store }

func (downStore) Reserve(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	return nil, false, fmt.Errorf("dial tcp: connection refused: %w", idemstore.ErrUnavailable)
}

// A consumer whose context ends mid-handler: the handler's context ends;
// the context's error of an External handler sends the key to review
// (terminated, never run twice); Retryable naks, and the redelivery runs.
func TestContextCancelledMidHandler(t *testing.T) {
	t.Parallel()
	for _, retryable := range []bool{false, true} {
		e, _ := memEngine(t, idem.EngineConfig{})
		g := newGuard(t, e, idemnats.Config{})
		ctx, cancel := context.WithCancel(context.Background())
		var runs atomic.Int32
		h := func(ctx context.Context, _ jetstream.Msg) ([]*nats.Msg, error) {
			if runs.Add(1) > 1 {
				return nil, nil
			}
			cancel()
			<-ctx.Done()
			if retryable {
				return nil, idem.Retryable(ctx.Err())
			}
			return nil, ctx.Err()
		}
		m := newMsg(1, "x")
		if err := g.Handle(ctx, m, h); !errors.Is(err, context.Canceled) {
			t.Fatalf("%v", err)
		}
		again := newMsg(1, "x") // to another consumer
		err := newGuard(t, e, idemnats.Config{}).Handle(context.Background(), again, h)
		switch {
		case retryable && (err != nil || runs.Load() != 2 || m.ack(t) != "nak"):
			t.Fatalf("retryable: %v, %d runs, first %q", err, runs.Load(), m.ack(t))
		case !retryable && (!errors.Is(err, idem.ErrNeedsReview) || runs.Load() != 1):
			t.Fatalf("plain: %v, %d runs", err, runs.Load())
		}
	}
}

// Produced messages come back byte for byte, and a corrupt stored answer
// is refused, never half-published.
func TestAnswerRoundTrip(t *testing.T) {
	t.Parallel()
	in := []*nats.Msg{
		{Subject: "a.b", Header: nats.Header{"K\xff": {"v\x00", ""}, "Nats-Msg-Id": {"id-1"}}, Data: []byte{0, 0xff}},
		{Subject: "c", Data: nil},
	}
	resp, err := idemnats.Answer(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := idemnats.DecodeAnswer(resp.Body)
	if err != nil || len(out) != 2 || out[0].Header["K\xff"][0] != "v\x00" || string(out[0].Data) != "\x00\xff" || out[1].Header.Get("Nats-Msg-Id") == "" {
		t.Fatalf("%v: %+v", err, out)
	}
	for i := 1; i < len(resp.Body); i++ { // empty is an operator's answer: no messages
		if _, err := idemnats.DecodeAnswer(resp.Body[:i]); err == nil {
			t.Fatalf("a stored answer cut at %d decoded", i)
		}
	}
	if _, err := idemnats.DecodeAnswer(append([]byte{1}, 0xff, 0xff, 0xff, 0xff, 0x0f)); err == nil {
		t.Fatal("a huge count decoded")
	}
}

// An operator completed the key with status 200 and no body: the
// redelivery is acked without running the handler or publishing anything.
func TestOperatorsEmptyCompletion(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "MESSAGE", Operation: "ORDERS", Body: []byte("x")}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: "billing", Operation: "ORDERS", Key: "ORDERS:1"}, Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Lease.Complete(context.Background(), &idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	var pub publisher
	var c counting
	m := newMsg(1, "x")
	if err := newGuard(t, e, idemnats.Config{Publisher: &pub}).Handle(context.Background(), m, c.handle); err != nil || m.ack(t) != "ack" || c.runs.Load() != 0 || len(pub.ids()) != 0 {
		t.Fatalf("%v, %q, %d runs, published %q", err, m.ack(t), c.runs.Load(), pub.ids())
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	for name, tc := range map[string]struct {
		e   *idem.Engine
		cfg idemnats.Config
	}{
		"no engine":    {nil, idemnats.Config{}},
		"unknown kind": {e, idemnats.Config{Kind: 9}},
		"negative":     {e, idemnats.Config{NakDelay: -1}},
		"long scope":   {e, idemnats.Config{Scope: strings.Repeat("s", idem.MaxScopeLength+1)}},
		"blank scope":  {e, idemnats.Config{Scope: " \t"}},
		"empty header": {e, idemnats.Config{FingerprintHeaders: []string{""}}},
	} {
		if _, err := idemnats.New(tc.e, tc.cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// noMetadata is a message that did not come from a JetStream consumer.
type noMetadata struct{ *fakeMsg }

func (noMetadata) Metadata() (*jetstream.MsgMetadata, error) { return nil, jetstream.ErrNotJSMessage }

// A message without JetStream metadata, and no Scope and Operation set:
// terminated with a reason that says what to configure; with them set and
// a Nats-Msg-Id, it runs.
func TestMessageWithoutMetadata(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	m := noMetadata{newMsg(1, "x", "Nats-Msg-Id", "o-1")}
	err := newGuard(t, e, idemnats.Config{}).Handle(context.Background(), m, c.handle)
	if !idemnats.IsTerminated(err) || !strings.Contains(m.ack(t), "Config.Scope") || c.runs.Load() != 0 {
		t.Fatalf("%v, %q", err, m.ack(t))
	}
	m = noMetadata{newMsg(1, "x", "Nats-Msg-Id", "o-1")}
	g := newGuard(t, e, idemnats.Config{Scope: "billing", Operation: func(jetstream.Msg) string { return "orders" }})
	if err := g.Handle(context.Background(), m, func(context.Context, jetstream.Msg) ([]*nats.Msg, error) { return nil, nil }); err != nil || m.ack(t) != "ack" {
		t.Fatalf("configured: %v, %q", err, m.ack(t))
	}
}

// A message delivered again (NumDelivered > 1) while its key is in flight
// may be the holder's own message, its consumer dead: it waits until the
// holder's lease would run out, and a second more, so that in-flight
// deliveries do not use up MaxDeliver first. A first delivery waits about
// as long as the holder has been at work, at most NakDelay.
func TestInFlightRedeliveryWaitsForTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := memEngine(t, idem.EngineConfig{Lease: 30 * time.Second})
		g := newGuard(t, e, idemnats.Config{})
		release := make(chan struct{})
		done := make(chan error)
		go func() {
			done <- g.Handle(context.Background(), newMsg(1, "x"), func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
				<-release
				return nil, nil
			})
		}()
		synctest.Wait()             // the first handler holds the key and waits for release
		time.Sleep(2 * time.Second) // the bubble's clock: two seconds into the lease
		for delivered, want := range map[uint64]string{1: "nak 2s", 2: "nak 29s", 5: "nak 29s"} {
			m := newMsg(1, "x")
			m.md.NumDelivered = delivered
			if err := g.Handle(context.Background(), m, func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
				t.Error("the handler ran twice")
				return nil, nil
			}); !errors.Is(err, idem.ErrInFlight) {
				t.Fatal(err)
			}
			if a := m.ack(t); a != want {
				t.Errorf("delivery %d: %q; want %q", delivered, a, want)
			}
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		letHeartbeatExit()
	})
}

// With a long lease, InProgress still comes often enough for JetStream's
// default AckWait (30s): every DefaultInProgressInterval, not every third
// of the lease, or JetStream would deliver the message again while its
// handler runs, using up MaxDeliver.
func TestInProgressUnderDefaultAckWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := memEngine(t, idem.EngineConfig{Lease: 3 * time.Minute})
		g := newGuard(t, e, idemnats.Config{})
		m := newMsg(1, "x")
		if err := g.Handle(context.Background(), m, func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
			time.Sleep(time.Minute + time.Millisecond) // the bubble's clock: a handler that works a minute
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		m.mu.Lock()
		wip := m.wip
		m.mu.Unlock()
		if want := int(time.Minute / idemnats.DefaultInProgressInterval); wip != want {
			t.Fatalf("InProgress %d times in a minute with a 3-minute lease; want %d", wip, want)
		}
		letHeartbeatExit()
	})
}

// A Term carries its reason only to a server known to honour it (2.10.4
// and later); earlier servers ignore a Term with a reason and deliver the
// message again, forever, so they and servers of unknown version get a
// plain Term. The reason is logged either way.
func TestTermReasonOnlyWhereHonoured(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{"2.10.4": true, "2.10.10": true, "2.11.0-RC.1": true, "3.0.0": true,
		"2.10.3": false, "2.9.10": false, "": false, "2.10": false, "x.y.z": false, "2.1x.4": false} {
		if got := idemnats.VersionAtLeast(v, 2, 10, 4); got != want {
			t.Errorf("version %q: at least 2.10.4 %v, want %v", v, got, want)
		}
	}
	for _, tc := range []struct{ version, want string }{
		{"2.9.10", "term"},
		{"", "term"},
		{"2.10.4", "term: idemnats: missing_key: the message has no key"},
	} {
		e, _ := memEngine(t, idem.EngineConfig{})
		var logs testenv.Buffer
		g, err := idemnats.New(e, idemnats.Config{Key: idemnats.HeaderKey("Order-Id"), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		idemnats.SetServerVersion(g, tc.version)
		m := newMsg(1, "x")
		if err := g.Handle(context.Background(), m, func(context.Context, jetstream.Msg) ([]*nats.Msg, error) { return nil, nil }); !idemnats.IsTerminated(err) {
			t.Fatalf("%v", err)
		}
		if a := m.ack(t); a != tc.want {
			t.Errorf("server %q: %q, want %q", tc.version, a, tc.want)
		}
		if !strings.Contains(logs.String(), "the message has no key") {
			t.Errorf("server %q: the reason was not logged: %s", tc.version, logs.String())
		}
	}
}

// StreamSequenceKey: the stream, the stream sequence and the time the
// message was stored; a stream name that would not make a valid key is
// replaced by its digest, the same for every message of the stream.
func TestStreamSequenceKey(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 1, 12, 0, 0, 123, time.UTC)
	key := func(stream string, seq uint64) string {
		m := newMsg(seq, "x")
		m.md.Stream, m.md.Timestamp = stream, at
		k, err := idemnats.StreamSequenceKey(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := idem.ValidateKey(k); err != nil {
			t.Fatalf("%q: %v", k, err)
		}
		return k
	}
	ns := strconv.FormatInt(at.UnixNano(), 10)
	if k := key("ORDERS", 42); k != "ORDERS:42:"+ns {
		t.Errorf("key %q", k)
	}
	long := strings.Repeat("S", 255)
	for _, stream := range []string{long, "ЗАКАЗЫ"} {
		k := key(stream, 7)
		if !strings.HasPrefix(k, "sha256-") || !strings.HasSuffix(k, ":7:"+ns) || k != key(stream, 7) {
			t.Errorf("%.10q…: key %q", stream, k)
		}
	}
	if key(long, 7) == key(long[:254]+"T", 7) {
		t.Error("two long stream names share a key")
	}
}

// Through MessageHandler, whose errors go nowhere, the guard's log is the
// only trace of a message that was not handled: a handler's error, a store
// that is down, a Term and its reason each leave a warning.
func TestMessageHandlerLogsWhatItDrops(t *testing.T) {
	t.Parallel()
	_, mem := memEngine(t, idem.EngineConfig{})
	down, err := idem.NewEngine(downStore{mem}, idem.EngineConfig{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	up, _ := memEngine(t, idem.EngineConfig{})
	for _, tc := range []struct {
		name string
		e    *idem.Engine
		msg  *fakeMsg
		h    idemnats.HandlerFunc
		want string
	}{
		{"retryable", up, newMsg(1, "x"), func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
			return nil, idem.Retryable(errors.New("the ledger was busy"))
		}, "the ledger was busy"},
		{"store down", down, newMsg(2, "x"), nil, "connection refused"},
		{"terminated", up, &fakeMsg{subject: "orders.placed"}, nil, "message terminated"}, // no stream, no consumer
	} {
		var logs testenv.Buffer
		g := newGuard(t, tc.e, idemnats.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		g.MessageHandler(context.Background(), tc.h)(tc.msg)
		if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, tc.want) {
			t.Errorf("%s: logged %q; want a warning with %q", tc.name, out, tc.want)
		}
	}
}

// A store that stays down: each delivery of a message waits twice as long
// as the one before (NakDelay, then doubled, at most 32 × NakDelay), so
// that an outage does not use up the consumer's MaxDeliver in a few
// NakDelays and have JetStream give up on messages that never ran.
func TestStoreDownBacksOff(t *testing.T) {
	t.Parallel()
	_, mem := memEngine(t, idem.EngineConfig{})
	e, err := idem.NewEngine(downStore{mem}, idem.EngineConfig{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	g := newGuard(t, e, idemnats.Config{NakDelay: time.Second})
	for delivered, want := range map[uint64]string{0: "nak 1s", 1: "nak 1s", 2: "nak 2s", 3: "nak 4s", 6: "nak 32s", 7: "nak 32s", 200: "nak 32s"} {
		m := newMsg(1, "x")
		m.md.NumDelivered = delivered
		if err := g.Handle(context.Background(), m, nil); !errors.Is(err, idemstore.ErrUnavailable) {
			t.Fatal(err)
		}
		if a := m.ack(t); a != want {
			t.Errorf("delivery %d: %q, want %q", delivered, a, want)
		}
	}
}

// A handler that keeps failing with Retryable: its message comes back at
// once after the first failure, and after later ones with a delay that
// doubles (from NakDelay, at most 32 × NakDelay), instead of looping hot
// and using up MaxDeliver in a moment. A failed publication backs off the
// same way.
func TestRetryableFailuresBackOff(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	pub := &publisher{}
	g := newGuard(t, e, idemnats.Config{NakDelay: time.Second, Publisher: pub})
	failing := func(context.Context, jetstream.Msg) ([]*nats.Msg, error) {
		return nil, idem.Retryable(errors.New("the provider is down"))
	}
	for delivered, want := range map[uint64]string{1: "nak", 2: "nak 2s", 4: "nak 8s", 9: "nak 32s"} {
		m := newMsg(1, "x")
		m.md.NumDelivered = delivered
		if err := g.Handle(context.Background(), m, failing); err == nil {
			t.Fatal("no error")
		}
		if a := m.ack(t); a != want {
			t.Errorf("delivery %d: %q, want %q", delivered, a, want)
		}
	}
	pub.fail.Store(1)
	m := newMsg(2, "y")
	m.md.NumDelivered = 3
	var c counting
	if err := g.Handle(context.Background(), m, c.handle); err == nil || m.ack(t) != "nak 4s" {
		t.Fatalf("a failed publication on delivery 3: %v, %q", err, m.ack(t))
	}
}
