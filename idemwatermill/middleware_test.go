package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemwatermill"
)

// A delivery after the handler completed (its ack was lost, its consumer
// died before acking) does not run the handler, and returns the very
// messages the first run produced: same UUIDs, metadata and payloads.
func TestRedeliveryEmitsTheSameMessages(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	h := protect(t, e, idemwatermill.Config{Scope: "billing"}, c.handle)
	first, err := h(delivery("m-1", "order 1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := h(delivery("m-1", "order 1", "_watermill_redelivered", "true"))
	if err != nil {
		t.Fatal(err)
	}
	if c.runs.Load() != 1 {
		t.Fatalf("the handler ran %d times", c.runs.Load())
	}
	if len(first) != 1 || len(again) != 1 || !first[0].Equals(again[0]) {
		t.Fatalf("the redelivery emitted %v, the first run %v", again, first)
	}
}

// Produced messages without a UUID get one before they are stored, so that
// a redelivery emits them under the same UUID.
func TestProducedMessagesGetStableUUIDs(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	h := protect(t, e, idemwatermill.Config{Scope: "billing"}, func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("", []byte("a")), message.NewMessage("", []byte("b"))}, nil
	})
	first, err := h(delivery("m-1", "x"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := h(delivery("m-1", "x"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if first[i].UUID == "" || first[i].UUID != again[i].UUID {
			t.Fatalf("message %d: first UUID %q, redelivered %q", i, first[i].UUID, again[i].UUID)
		}
	}
}

// A handler error marked Retryable releases the key: the redelivery runs
// the handler again, and it succeeds.
func TestRetryableRunsAgain(t *testing.T) {
	t.Parallel()
	e, store := memEngine(t, idem.EngineConfig{})
	c := counting{fail: func(run int32, _ *message.Message) error {
		if run == 1 {
			return idem.Retryable(errors.New("the provider refused; nothing happened"))
		}
		return nil
	}}
	h := protect(t, e, idemwatermill.Config{Scope: "billing"}, c.handle)
	if _, err := h(delivery("m-1", "x")); err == nil || idemwatermill.IsPoison(err) {
		t.Fatalf("first delivery: %v; want the handler's error, not poison", err)
	}
	if _, err := store.Get(context.Background(), idem.Key{Scope: "billing", Operation: "message", Key: "m-1"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the key was not released: %v", err)
	}
	out, err := h(delivery("m-1", "x"))
	if err != nil || len(out) != 1 || c.runs.Load() != 2 {
		t.Fatalf("redelivery: %v, %v, %d runs", out, err, c.runs.Load())
	}
}

// What a handler error does to the key, by its mark and the operation's
// kind, and what the redelivery finds.
func TestHandlerErrorSettlesByKind(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name   string
		kind   idem.Kind
		err    error
		review bool
	}{
		{"plain external", idem.External, boom, true},
		{"ambiguous", idem.Transactional, idem.Ambiguous(boom), true},
		{"plain transactional", idem.Transactional, boom, false},
		{"retryable external", idem.External, idem.Retryable(boom), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rv reviews
			e, _ := memEngine(t, idem.EngineConfig{OnReview: rv.onReview})
			c := counting{fail: func(int32, *message.Message) error { return tc.err }}
			h := protect(t, e, idemwatermill.Config{Scope: "billing", Kind: tc.kind}, c.handle)
			_, err := h(delivery("m-1", "x"))
			if !errors.Is(err, boom) {
				t.Fatalf("err %v does not wrap the handler's", err)
			}
			if idemwatermill.IsPoison(err) != tc.review || errors.Is(err, idem.ErrNeedsReview) != tc.review {
				t.Fatalf("err %v: poison %v, want %v", err, idemwatermill.IsPoison(err), tc.review)
			}
			_, err = h(delivery("m-1", "x"))
			switch {
			case tc.review && (!errors.Is(err, idem.ErrNeedsReview) || !idemwatermill.IsPoison(err) || c.runs.Load() != 1):
				t.Fatalf("redelivery: %v after %d runs; want needs review, poison, one run", err, c.runs.Load())
			case !tc.review && c.runs.Load() != 2:
				t.Fatalf("redelivery: %v after %d runs; want a second run", err, c.runs.Load())
			case tc.review != (rv.count() == 1):
				t.Fatalf("OnReview told %d times", rv.count())
			}
		})
	}
}

// The same UUID with another payload is poison, and the handler does not
// run; another value of a fingerprinted metadata field too, but not of one
// the configuration does not name.
func TestSameKeyOtherPayloadIsPoison(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	h := protect(t, e, idemwatermill.Config{Scope: "billing", FingerprintMetadata: []string{"amount"}}, c.handle)
	if _, err := h(delivery("m-1", "order 1", "amount", "10", "trace", "a")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*message.Message{
		delivery("m-1", "order 2", "amount", "10"),
		delivery("m-1", "order 1", "amount", "11"),
		delivery("m-1", "order 1"),
	} {
		_, err := h(d)
		var ie *idemwatermill.Error
		if !errors.As(err, &ie) || ie.Situation != idem.SituationMismatch || !idemwatermill.IsPoison(err) || !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("%s %v: err %v; want a poison mismatch", d.Payload, d.Metadata, err)
		}
	}
	if _, err := h(delivery("m-1", "order 1", "amount", "10", "trace", "b")); err != nil {
		t.Fatalf("unnamed metadata changed the fingerprint: %v", err)
	}
	if c.runs.Load() != 1 {
		t.Fatalf("the handler ran %d times", c.runs.Load())
	}
}

// A message redelivered while its first handling still runs is held for
// about as long as that handling has taken (at most NackDelay), then
// refused with an error that is not poison: the router nacks it, and it
// comes back.
func TestInFlightNacksAfterDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			nackDelay, want time.Duration
		}{
			{0, time.Second}, // RetryAfter: at least a second
			{300 * time.Millisecond, 300 * time.Millisecond},
			{-1, 0},
		} {
			e, _ := memEngine(t, idem.EngineConfig{})
			release := make(chan struct{})
			started := make(chan struct{})
			h := protect(t, e, idemwatermill.Config{Scope: "billing", NackDelay: tc.nackDelay}, func(*message.Message) ([]*message.Message, error) {
				close(started)
				<-release
				return nil, nil
			})
			done := make(chan error)
			go func() {
				_, err := h(delivery("m-1", "x"))
				done <- err
			}()
			<-started
			start := time.Now()
			_, err := h(delivery("m-1", "x"))
			if waited := time.Since(start); waited != tc.want {
				t.Errorf("NackDelay %v: held %v, want %v", tc.nackDelay, waited, tc.want)
			}
			var ie *idemwatermill.Error
			if !errors.As(err, &ie) || ie.Situation != idem.SituationInFlight || idemwatermill.IsPoison(err) || ie.RetryAfter < time.Second {
				t.Errorf("err %v; want in flight, not poison", err)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		idleEngines()
	})
}

// idleEngines lets fake time pass until the engines' heartbeat loops,
// which linger a moment after their last lease, have exited.
func idleEngines() { time.Sleep(time.Second) }

// The hold ends when the message's context does (the router closing).
func TestInFlightHoldEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := memEngine(t, idem.EngineConfig{})
		release := make(chan struct{})
		started := make(chan struct{})
		h := protect(t, e, idemwatermill.Config{Scope: "billing", NackDelay: time.Hour}, func(*message.Message) ([]*message.Message, error) {
			close(started)
			<-release
			return nil, nil
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = h(delivery("m-1", "x"))
		}()
		<-started
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		d := delivery("m-1", "x")
		d.SetContext(ctx)
		start := time.Now()
		if _, err := h(d); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("err %v", err)
		}
		if waited := time.Since(start); waited != 50*time.Millisecond {
			t.Fatalf("held %v after the context ended at 50ms", waited)
		}
		close(release)
		<-done
		idleEngines()
	})
}

// A handler that runs longer than the lease keeps its key: heartbeats renew
// it, and a redelivery meanwhile finds it in flight (not taken over).
func TestHeartbeatKeepsLongHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _ := memEngine(t, idem.EngineConfig{Lease: time.Second})
		release := make(chan struct{})
		var c counting
		h := protect(t, e, idemwatermill.Config{Scope: "billing", Kind: idem.Transactional, NackDelay: -1}, func(m *message.Message) ([]*message.Message, error) {
			<-release
			return c.handle(m)
		})
		done := make(chan error)
		go func() {
			_, err := h(delivery("m-1", "x"))
			done <- err
		}()
		time.Sleep(10 * time.Second) // fake time: ten leases
		if _, err := h(delivery("m-1", "x")); !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("after ten leases a redelivery got %v; want in flight", err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if c.runs.Load() != 1 {
			t.Fatalf("%d runs", c.runs.Load())
		}
		idleEngines()
	})
}

// A panicking handler's key goes to review, as the HTTP middleware does,
// whatever the kind, and the panic goes on (to Watermill's Recoverer, or
// the process).
func TestPanicEscalates(t *testing.T) {
	t.Parallel()
	for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
		e, _ := memEngine(t, idem.EngineConfig{})
		var runs atomic.Int32
		h := protect(t, e, idemwatermill.Config{Scope: "billing", Kind: kind}, func(*message.Message) ([]*message.Message, error) {
			runs.Add(1)
			panic("handler bug")
		})
		func() {
			defer func() {
				if p := recover(); p != "handler bug" {
					t.Fatalf("recovered %v", p)
				}
			}()
			_, _ = h(delivery("m-1", "x"))
		}()
		if _, err := h(delivery("m-1", "x")); !errors.Is(err, idem.ErrNeedsReview) || !idemwatermill.IsPoison(err) || runs.Load() != 1 {
			t.Fatalf("%v: redelivery %v after %d runs", kind, err, runs.Load())
		}
	}
}

// Messages without a usable key are refused as poison, never handled
// unprotected, unless KeyOptional lets a missing one through; a malformed
// one is refused either way. The error never shows the key.
func TestKeysMissingOrHostile(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	for _, tc := range []struct {
		name     string
		uuid     string
		optional bool
		want     idem.Situation
	}{
		{"missing", "", false, idem.SituationMissingKey},
		{"missing optional", "", true, idem.SituationNoKey},
		{"too long", strings.Repeat("k", idem.MaxKeyLength+1), true, idem.SituationInvalidKey},
		{"control bytes", "k\r\nX-Evil: 1", true, idem.SituationInvalidKey},
		{"space", "two words", false, idem.SituationInvalidKey},
		{"not ascii", "заказ-1", false, idem.SituationInvalidKey},
		{"NUL", "a\x00b", false, idem.SituationInvalidKey},
	} {
		var c counting
		var ev idemwatermill.Event
		h := protect(t, e, idemwatermill.Config{Scope: "billing", KeyOptional: tc.optional, OnOutcome: func(x idemwatermill.Event) { ev = x }}, c.handle)
		_, err := h(delivery(tc.uuid, "x"))
		if ev.Outcome != tc.want.Name {
			t.Errorf("%s: outcome %q, want %q (err %v)", tc.name, ev.Outcome, tc.want.Name, err)
		}
		if tc.want == idem.SituationNoKey {
			if err != nil || c.runs.Load() != 1 {
				t.Errorf("%s: %v, %d runs; want the handler run", tc.name, err, c.runs.Load())
			}
			continue
		}
		if !idemwatermill.IsPoison(err) || c.runs.Load() != 0 {
			t.Errorf("%s: %v, %d runs; want poison, no run", tc.name, err, c.runs.Load())
		}
		if tc.uuid != "" && strings.Contains(err.Error(), tc.uuid) {
			t.Errorf("%s: the error shows the key: %v", tc.name, err)
		}
	}
}

// A business ID from metadata keys the message: the same order published
// twice with two UUIDs runs once; a message without the field is refused.
func TestMetadataKey(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var c counting
	h := protect(t, e, idemwatermill.Config{Scope: "billing", Key: idemwatermill.MetadataKey("order_id")}, c.handle)
	for _, uuid := range []string{"u-1", "u-2"} {
		if _, err := h(delivery(uuid, "x", "order_id", "o-42")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h(delivery("u-3", "x")); !errors.Is(err, idem.ErrMissingKey) || !idemwatermill.IsPoison(err) {
		t.Fatalf("no order_id: %v", err)
	}
	if c.runs.Load() != 1 {
		t.Fatalf("%d runs", c.runs.Load())
	}
}

// Huge payloads are fingerprinted whole; produced messages over the
// engine's MaxResponseBody complete the key as not replayable, so a
// redelivery neither runs the handler nor pretends to emit its messages.
func TestHugePayloads(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{MaxResponseBody: 1 << 20})
	big := strings.Repeat("x", 8<<20)
	var runs atomic.Int32
	h := protect(t, e, idemwatermill.Config{Scope: "billing"}, func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return []*message.Message{message.NewMessage("out-1", m.Payload)}, nil
	})
	out, err := h(delivery("m-1", big))
	if err != nil || len(out) != 1 || len(out[0].Payload) != len(big) {
		t.Fatalf("first delivery: %v", err)
	}
	if _, err := h(delivery("m-1", big[:len(big)-1]+"y")); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("a huge payload differing in its last byte: %v; want a mismatch", err)
	}
	_, err = h(delivery("m-1", big))
	if !errors.Is(err, idem.ErrNotReplayable) || !idemwatermill.IsPoison(err) || runs.Load() != 1 {
		t.Fatalf("redelivery: %v after %d runs; want not replayable, poison, one run", err, runs.Load())
	}
}

// Produced messages with metadata or UUIDs that are not valid UTF-8 come
// back byte for byte.
func TestProducedBytesKept(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	h := protect(t, e, idemwatermill.Config{Scope: "billing"}, func(*message.Message) ([]*message.Message, error) {
		m := message.NewMessage("id-\xff", []byte{0, 1, 0xfe})
		m.Metadata.Set("k\xfe", "v\x80")
		m.Metadata.Set("plain", "value")
		return []*message.Message{m}, nil
	})
	first, err := h(delivery("m-1", "x"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := h(delivery("m-1", "x"))
	if err != nil || !first[0].Equals(again[0]) || again[0].UUID != "id-\xff" {
		t.Fatalf("replayed %q %v %q, %v", again[0].UUID, again[0].Metadata, again[0].Payload, err)
	}
}

// A consumer whose context ends mid-handler: a handler that returns the
// context's error has an unknown outcome, so an External key goes to
// review (the message is poison, never run twice); one that knows nothing
// happened says so with Retryable, and the redelivery runs. The settlement
// is not cancelled with the context.
func TestContextCancelledMidHandler(t *testing.T) {
	t.Parallel()
	for _, retryable := range []bool{false, true} {
		e, _ := memEngine(t, idem.EngineConfig{})
		var c counting
		started := make(chan struct{}, 2)
		h := protect(t, e, idemwatermill.Config{Scope: "billing"}, func(m *message.Message) ([]*message.Message, error) {
			if c.runs.Load() > 0 {
				return c.handle(m)
			}
			c.runs.Add(1)
			started <- struct{}{}
			<-m.Context().Done()
			if retryable {
				return nil, idem.Retryable(m.Context().Err())
			}
			return nil, m.Context().Err()
		})
		ctx, cancel := context.WithCancel(context.Background())
		d := delivery("m-1", "x")
		d.SetContext(ctx)
		done := make(chan error)
		go func() {
			_, err := h(d)
			done <- err
		}()
		<-started
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) || idemwatermill.IsPoison(err) == retryable {
			t.Fatalf("retryable %v: %v", retryable, err)
		}
		_, err := h(delivery("m-1", "x"))
		switch {
		case retryable && (err != nil || c.runs.Load() != 2):
			t.Fatalf("retryable: redelivery %v after %d runs", err, c.runs.Load())
		case !retryable && (!errors.Is(err, idem.ErrNeedsReview) || c.runs.Load() != 1):
			t.Fatalf("plain: redelivery %v after %d runs", err, c.runs.Load())
		}
	}
}

// blipStore fails the first Complete after (lost) or before applying it.
type blipStore struct {
	idemstore.Store
	lost  bool
	blips atomic.Int32
}

func (s *blipStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if s.blips.Add(1) == 1 {
		if s.lost {
			if err := s.Store.Complete(ctx, p); err != nil {
				return err
			}
		}
		return fmt.Errorf("connection reset by peer: %w", idemstore.ErrUnavailable)
	}
	return s.Store.Complete(ctx, p)
}

// A store that blips once during Complete (before applying it, or after,
// losing the reply): the message is acked with its produced messages, and
// a redelivery emits the same ones without running the handler.
func TestStoreBlipsDuringComplete(t *testing.T) {
	t.Parallel()
	for _, lost := range []bool{false, true} {
		_, mem := memEngine(t, idem.EngineConfig{})
		e, err := idem.NewEngine(&blipStore{Store: mem, lost: lost}, idem.EngineConfig{Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		var c counting
		h := protect(t, e, idemwatermill.Config{Scope: "billing"}, c.handle)
		first, err := h(delivery("m-1", "x"))
		if err != nil {
			t.Fatalf("lost %v: %v", lost, err)
		}
		again, err := h(delivery("m-1", "x"))
		if err != nil || c.runs.Load() != 1 || !first[0].Equals(again[0]) {
			t.Fatalf("lost %v: redelivery %v, %v after %d runs", lost, again, err, c.runs.Load())
		}
	}
}

// A store that is down when the message arrives: the handler does not run,
// and the error is not poison (the router nacks; the message comes back).
func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	_, mem := memEngine(t, idem.EngineConfig{})
	e, err := idem.NewEngine(downStore{mem}, idem.EngineConfig{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	var c counting
	var ev idemwatermill.Event
	h := protect(t, e, idemwatermill.Config{Scope: "billing", NackDelay: -1, OnOutcome: func(x idemwatermill.Event) { ev = x }}, c.handle)
	_, err = h(delivery("m-1", "x"))
	if !errors.Is(err, idemstore.ErrUnavailable) || idemwatermill.IsPoison(err) || c.runs.Load() != 0 || ev.Outcome != "unavailable" {
		t.Fatalf("%v, %d runs, outcome %q", err, c.runs.Load(), ev.Outcome)
	}
}

type downStore struct{ idemstore.Store }

func (downStore) Reserve(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	return nil, false, fmt.Errorf("dial tcp: connection refused: %w", idemstore.ErrUnavailable)
}

// A key an operator completed with a failure is not a handler's answer:
// poison, and the handler does not run.
func TestReplayOfAnOperatorsAnswer(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	key := idem.Key{Scope: "billing", Operation: "message", Key: "m-1"}
	fp := mustFingerprint(t, "x")
	res, err := e.Begin(context.Background(), idem.Request{Key: key, Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Lease.Complete(context.Background(), &idem.Response{Status: 502, Body: []byte("provider declined")}); err != nil {
		t.Fatal(err)
	}
	var c counting
	h := protect(t, e, idemwatermill.Config{Scope: "billing"}, c.handle)
	if _, err := h(delivery("m-1", "x")); !errors.Is(err, idem.ErrNotAResult) || !idemwatermill.IsPoison(err) || c.runs.Load() != 0 {
		t.Fatalf("%v after %d runs", err, c.runs.Load())
	}
}

// An operator completed the key (the effect happened) with status 200 and
// no body: a redelivery is acked, emitting nothing, and the handler does not
// run; with a body that is not produced messages, it is poison.
func TestReplayOfAnOperatorsCompletion(t *testing.T) {
	t.Parallel()
	for _, body := range []string{"", "done by hand"} {
		e, _ := memEngine(t, idem.EngineConfig{})
		res, err := e.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: "billing", Operation: "message", Key: "m-1"}, Fingerprint: mustFingerprint(t, "x")})
		if err != nil {
			t.Fatal(err)
		}
		if err := res.Lease.Complete(context.Background(), &idem.Response{Status: 200, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		var c counting
		out, err := protect(t, e, idemwatermill.Config{Scope: "billing"}, c.handle)(delivery("m-1", "x"))
		switch {
		case c.runs.Load() != 0:
			t.Fatalf("body %q: the handler ran", body)
		case body == "" && (err != nil || len(out) != 0):
			t.Fatalf("empty answer: %v, %v; want acked with nothing emitted", out, err)
		case body != "" && !idemwatermill.IsPoison(err):
			t.Fatalf("body %q: %v; want poison", body, err)
		}
	}
}

// mustFingerprint is the middleware's fingerprint of a payload without
// fingerprinted metadata, outside a router.
func mustFingerprint(t *testing.T, payload string) string {
	t.Helper()
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "MESSAGE", Operation: "message", Body: []byte(payload)}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// Misconfiguration fails at construction.
func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	for name, tc := range map[string]struct {
		e   *idem.Engine
		cfg idemwatermill.Config
	}{
		"no engine":    {nil, idemwatermill.Config{Scope: "billing"}},
		"unknown kind": {e, idemwatermill.Config{Scope: "billing", Kind: 7}},
		"long scope":   {e, idemwatermill.Config{Scope: strings.Repeat("s", idem.MaxScopeLength+1)}},
		"blank scope":  {e, idemwatermill.Config{Scope: " \t"}},
		"negative":     {e, idemwatermill.Config{Scope: "billing", Lease: -time.Second}},
		"empty field":  {e, idemwatermill.Config{Scope: "billing", FingerprintMetadata: []string{""}}},
		"no scope":     {e, idemwatermill.Config{}},
		"both scopes":  {e, idemwatermill.Config{Scope: "billing", HandlerScope: true}},
		"slash scope":  {e, idemwatermill.Config{Scope: "a/b", ScopeFunc: func(*message.Message) (string, error) { return "t", nil }}},
		// Handlers "a" and "a/b" (one Operation), tenants "b/c" and
		// "c": both scopes would be "a/b/c", and one tenant would get
		// the other's answer.
		"handler scope with tenants": {e, idemwatermill.Config{HandlerScope: true, ScopeFunc: func(*message.Message) (string, error) { return "t", nil }}},
	} {
		if _, err := idemwatermill.New(tc.e, tc.cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Middleware did not panic on a bad config")
		}
	}()
	idemwatermill.Middleware(nil, idemwatermill.Config{Scope: "billing"})
}

// A consumer died mid-handler (its lease is never settled nor renewed):
// once the lease expires, an External message's key goes to review and the
// redelivery is poison, never run again blindly; a Transactional one is
// taken over and runs.
func TestConsumerDiedMidHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
			var rv reviews
			e, _ := memEngine(t, idem.EngineConfig{Lease: 2 * time.Second, OnReview: rv.onReview})
			// The dead consumer's reservation.
			if _, err := e.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: "billing", Operation: "message", Key: "m-1"},
				Fingerprint: mustFingerprint(t, "x"), Kind: kind}); err != nil {
				t.Fatal(err)
			}
			var c counting
			h := protect(t, e, idemwatermill.Config{Scope: "billing", Kind: kind, NackDelay: -1}, c.handle)
			if _, err := h(delivery("m-1", "x")); !errors.Is(err, idem.ErrInFlight) {
				t.Fatalf("%v: while the lease lives: %v", kind, err)
			}
			time.Sleep(3 * time.Second) // fake time: the lease expires
			_, err := h(delivery("m-1", "x"))
			switch kind {
			case idem.External:
				if !errors.Is(err, idem.ErrNeedsReview) || !idemwatermill.IsPoison(err) || c.runs.Load() != 0 || rv.count() != 1 {
					t.Fatalf("external: %v, %d runs, %d reviews", err, c.runs.Load(), rv.count())
				}
			case idem.Transactional:
				if err != nil || c.runs.Load() != 1 {
					t.Fatalf("transactional: %v, %d runs", err, c.runs.Load())
				}
			}
		}
		idleEngines()
	})
}

// OnOutcome reports every message, a panicking handler's too, with the
// settlement of its key.
func TestOnOutcome(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	var events []idemwatermill.Event
	h := protect(t, e, idemwatermill.Config{Scope: "billing", OnOutcome: func(ev idemwatermill.Event) { events = append(events, ev) }},
		func(m *message.Message) ([]*message.Message, error) {
			if string(m.Payload) == "panic" {
				panic("boom")
			}
			return nil, nil
		})
	_, _ = h(delivery("m-1", "x"))
	_, _ = h(delivery("m-1", "x"))
	func() {
		defer func() { _ = recover() }()
		_, _ = h(delivery("m-2", "panic"))
	}()
	want := []string{"acquired/completed", "replayed/", "acquired/escalated"}
	if len(events) != len(want) {
		t.Fatalf("%d events: %+v", len(events), events)
	}
	for i, ev := range events {
		if got := ev.Outcome + "/" + ev.Settlement; got != want[i] || ev.Operation != "message" {
			t.Errorf("event %d: %s (operation %q), want %s", i, got, ev.Operation, want[i])
		}
	}
}

// A store that is down: the message is held for NackDelay before its
// error goes back to the router, as a key in flight is, so that a
// subscriber that redelivers a nacked message at once (watermill-amqp)
// does not loop on it, and on the store, as fast as it can.
func TestStoreDownHoldsBeforeNack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, mem := memEngine(t, idem.EngineConfig{})
		e, err := idem.NewEngine(downStore{mem}, idem.EngineConfig{Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ nackDelay, want time.Duration }{
			{0, idemwatermill.DefaultNackDelay},
			{300 * time.Millisecond, 300 * time.Millisecond},
			{-1, 0},
		} {
			var c counting
			h := protect(t, e, idemwatermill.Config{Scope: "billing", NackDelay: tc.nackDelay}, c.handle)
			start := time.Now()
			if _, err := h(delivery("m-1", "x")); !errors.Is(err, idemstore.ErrUnavailable) || idemwatermill.IsPoison(err) {
				t.Fatalf("%v", err)
			}
			if held := time.Since(start); held != tc.want {
				t.Errorf("NackDelay %v: held %v, want %v", tc.nackDelay, held, tc.want)
			}
		}
	})
}
