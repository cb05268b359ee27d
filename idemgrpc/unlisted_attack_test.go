package idemgrpc_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/testenv"
)

// logBuffer is a log that tests read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// TestUnlistedKeyProtected: a client that sends a key (the metadata, as
// WithKey does for a method without a key field) to a method the server's
// configuration does not list believes the call protected, and retries it
// with the key when the connection drops after the handler ran. The server
// protects it with the default policy: the retry replays, the handler runs
// once, and the call is logged by key digest (never the key) and reported
// with Event.Unlisted.
func TestUnlistedKeyProtected(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	var lost atomic.Int32
	// A connection that drops after the handler ran, once: the client
	// gets UNAVAILABLE, and retries with the same key.
	dropOnce := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err == nil && lost.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "connection reset")
		}
		return resp, err
	}
	const key = "refund-unlisted-1"
	f := &fakeSleep{clock: testenv.NewClock(time.Unix(0, 0))}
	ev := newEnv(t, idemgrpc.Config{Logger: logs.logger()}, envOptions{outer: []grpc.UnaryServerInterceptor{dropOnce},
		client: []grpc.DialOption{clientWith(idemgrpc.ClientConfig{}, f)}})
	var info idemgrpc.CallInfo
	r, err := ev.client.Refund(as("alice"), &testpb.RefundRequest{Charge: "pay_1", Amount: 5}, idemgrpc.WithKey(key), idemgrpc.WithCallInfo(&info))
	if err != nil || r.Run != 1 || info.Attempts != 2 || !info.Replayed {
		t.Fatalf("%v %v %+v, want run 1 replayed on the second attempt", r, err, info)
	}
	for i, want := range []string{"acquired", "replayed"} {
		if e := ev.event(); e.Outcome != want || !e.Unlisted {
			t.Fatalf("event %d: %+v, want %s and Unlisted", i, e, want)
		}
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
	digest := idem.KeyDigest(idem.Key{Scope: "user:alice", Operation: refundMethod, Key: key})
	if l := logs.String(); !strings.Contains(l, "key_digest="+digest) || !strings.Contains(l, refundMethod) || strings.Contains(l, key) {
		t.Fatalf("log %q: want the method and key_digest=%s, never the key", l, digest)
	}
	// Without a key, the method runs unprotected, as it always did.
	if _, err := ev.client.Refund(as("alice"), &testpb.RefundRequest{Charge: "pay_2"}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-ev.events:
		t.Fatalf("a call without a key reported %+v", e)
	default:
	}
}

// TestUnlistedKeyRefused: with RefuseUnlistedKeys, a call that carries a
// key to a method the configuration does not protect is refused with
// FAILED_PRECONDITION naming the method, and does not run; with
// IgnoreKeyFields, a method found only by its key field counts as not
// listed. A method with no side effects runs as it is.
func TestUnlistedKeyRefused(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	ev := newEnv(t, idemgrpc.Config{RefuseUnlistedKeys: true, IgnoreKeyFields: true, Logger: logs.logger()}, envOptions{})
	_, err := ev.client.Refund(as("alice", "refund-k"), &testpb.RefundRequest{Charge: "pay_1"})
	wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonMethodUnprotected)
	if !strings.Contains(status.Convert(err).Message(), refundMethod) {
		t.Fatalf("%v: want the method named", err)
	}
	if e := ev.event(); e.Outcome != "unprotected_method" || !e.Unlisted || e.Code != codes.FailedPrecondition {
		t.Fatalf("%+v", e)
	}
	_, err = ev.client.Charge(as("alice", uuid(5)), &testpb.ChargeRequest{Account: "a"})
	wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonMethodUnprotected)
	ev.event()
	if n := ev.svc.runs.Load(); n != 0 {
		t.Fatalf("runs %d, want none", n)
	}
	if l := logs.String(); strings.Contains(l, "refund-k") || !strings.Contains(l, "key_digest=") {
		t.Fatalf("log %q", l)
	}
	// A method with no side effects runs as it is, unreported.
	for range 2 {
		if _, err := ev.client.GetPayment(as("alice", "get-k"), &testpb.GetPaymentRequest{Id: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case e := <-ev.events:
		t.Fatalf("a method with no side effects reported %+v", e)
	default:
	}
}

// TestUnlistedKeyDefaultPolicy: an unlisted method protected because its
// call carried a key follows Policy, and a key that is invalid is refused
// as on any protected method.
func TestUnlistedKeyDefaultPolicy(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{IgnoreKeyFields: true, Policy: idemgrpc.Policy{ReleaseCodes: []codes.Code{}}}, envOptions{})
	ev.svc.charge = func(_ context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		return nil, status.Error(codes.Unavailable, "busy") // stored: the policy releases on no code
	}
	for range 2 {
		_, err := ev.client.Charge(as("alice", "charge-k"), &testpb.ChargeRequest{Account: "a"})
		if status.Code(err) != codes.Unavailable {
			t.Fatal(err)
		}
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("runs %d, want 1 (the second call replays)", n)
	}
	_, err := ev.client.Charge(as("alice", "bad key"), &testpb.ChargeRequest{Account: "a"})
	wantCode(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
}

// TestUnlistedKeyConcurrent: many calls at once with one key to a method
// the configuration does not list, the first ones on a server that has not
// seen the method yet: the handler runs once, and every other call gets
// its answer or IN_FLIGHT.
func TestUnlistedKeyConcurrent(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{Policy: idemgrpc.Policy{Wait: time.Minute}}, envOptions{})
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			r, err := ev.client.Refund(as("alice", "refund-concurrent"), &testpb.RefundRequest{Charge: "pay_1", Amount: 5})
			if err == nil && r.Run != 1 {
				err = status.Errorf(codes.Internal, "run %d", r.Run)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && idemgrpc.Reason(err) != idemgrpc.ReasonInFlight {
			t.Fatal(err)
		}
	}
	if n := ev.svc.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
}

// TestKeyFieldToServerIgnoringFields: a client that places its key in the
// request's key field (request_id, AEP-155 idempotency_key) sends it in
// the metadata too, so that a server that ignores key fields
// (IgnoreKeyFields) and does not list the method still sees a key and
// protects the call (or refuses it), instead of running every retry of it.
func TestKeyFieldToServerIgnoringFields(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{IgnoreKeyFields: true}, envOptions{})
	c := restartedClient(t, ev)
	for try := range 2 {
		p, err := c.Charge(as("alice"), &testpb.ChargeRequest{Account: "a", Amount: 5}, idemgrpc.WithKey(uuid(77)))
		if err != nil || p.Run != 1 {
			t.Fatalf("request_id, try %d: %v %v, want run 1", try, p, err)
		}
		s, err := c.Ship(as("alice"), &testpb.ShipRequest{Order: "o", IdempotencyKey: &testpb.IdempotencyKey{Key: "ship-ignored"}})
		if err != nil || s.Run != 2 {
			t.Fatalf("idempotency_key, try %d: %v %v, want run 2", try, s, err)
		}
	}
	if keys := ev.svc.seen(); len(keys) != 2 {
		t.Fatalf("the handlers ran for %q, want once each", keys)
	}
}
