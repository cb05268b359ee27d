package idemconnect_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemconnect"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/rpctest/testpb/testpbconnect"
)

// TestNoSideEffectsUnprotected: a procedure marked idempotency_level =
// NO_SIDE_EFFECTS has no effect to run twice, and Connect clients may send
// it as an HTTP GET (which caches and proxies may repeat): idem leaves it
// alone even when its request carries a request_id, over GET and POST, and
// naming it in the configuration is an error.
func TestNoSideEffectsUnprotected(t *testing.T) {
	t.Parallel()
	svc, srv := server(t, idemconnect.Config{})
	key := "0190a0e0-0000-7000-8000-000000000001"
	for i, opts := range [][]connect.ClientOption{{connect.WithHTTPGet()}, nil} {
		c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, opts...)
		for try := 0; try < 2; try++ {
			req := connect.NewRequest(&testpb.GetPaymentRequest{Id: "pay_1", RequestId: key})
			req.Header().Set("X-User", "alice")
			req.Header().Set("Idempotency-Key", key)
			res, err := c.GetPayment(context.Background(), req)
			if err != nil || idemconnect.Replayed(res.Header()) || res.Msg.Run != int64(2*i+try+1) {
				t.Fatalf("client %d, try %d: %v %v", i, try, res, err)
			}
			if want := []string{"GET", "POST"}[i]; res.Msg.Account != want {
				t.Fatalf("client %d sent %s, want %s", i, res.Msg.Account, want)
			}
		}
	}
	if n := svc.runs.Load(); n != 4 {
		t.Fatalf("runs %d", n)
	}

	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []idemconnect.Config{
		{Scope: idemconnect.GlobalScope, Methods: map[string]idemconnect.Policy{testpbconnect.PaymentsGetPaymentProcedure: {}}},
		{Scope: idemconnect.GlobalScope, Require: []string{testpbconnect.PaymentsGetPaymentProcedure}},
	} {
		if _, err := idemconnect.NewInterceptor(e, cfg); err == nil || !strings.Contains(err.Error(), "NO_SIDE_EFFECTS") {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
}

// TestUnlistedKey: a call that carries an Idempotency-Key to a procedure
// the configuration does not protect is never run unprotected in silence:
// by default it is protected with the default policy (the retry replays),
// and with RefuseUnlistedKeys it is refused with FAILED_PRECONDITION
// naming the procedure. Both are reported with Event.Unlisted.
func TestUnlistedKey(t *testing.T) {
	t.Parallel()
	for _, refuse := range []bool{false, true} {
		events := make(chan idemconnect.Event, 4)
		svc, srv := server(t, idemconnect.Config{IgnoreKeyFields: true, RefuseUnlistedKeys: refuse,
			OnOutcome: func(ev idemconnect.Event) { events <- ev }})
		c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL)
		var got [2]*connect.Response[testpb.Payment]
		var errs [2]error
		for try := range got {
			got[try], errs[try] = charge(context.Background(), c, "alice", "charge-unlisted", &testpb.ChargeRequest{Account: "a", Amount: 5})
			select { // OnOutcome ran before the answer was sent
			case ev := <-events:
				if !ev.Unlisted {
					t.Fatalf("refuse %v: %+v", refuse, ev)
				}
			default:
				t.Fatalf("refuse %v: try %d was not reported", refuse, try)
			}
		}
		if refuse {
			for _, err := range errs {
				if connect.CodeOf(err) != connect.CodeFailedPrecondition || idemconnect.Reason(err) != idemconnect.ReasonMethodUnprotected ||
					!strings.Contains(err.Error(), testpbconnect.PaymentsChargeProcedure) {
					t.Fatalf("%v", err)
				}
			}
			if n := svc.runs.Load(); n != 0 {
				t.Fatalf("runs %d", n)
			}
			continue
		}
		if errs[0] != nil || errs[1] != nil || got[1].Msg.Run != 1 || !idemconnect.Replayed(got[1].Header()) {
			t.Fatalf("%v %v %v", got, errs[0], errs[1])
		}
		if n := svc.runs.Load(); n != 1 {
			t.Fatalf("runs %d", n)
		}
	}
}

// TestKeyFieldToServerIgnoringFields: a client whose request carries its
// key in its request_id sends it in the Idempotency-Key header too, so
// that a server that ignores key fields (IgnoreKeyFields) and does not
// list the procedure still sees a key and protects the call, instead of
// running every retry of it.
func TestKeyFieldToServerIgnoringFields(t *testing.T) {
	t.Parallel()
	svc, srv := server(t, idemconnect.Config{IgnoreKeyFields: true})
	ci, err := idemconnect.NewClientInterceptor(idemconnect.ClientConfig{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, connect.WithInterceptors(ci))
	for try := range 2 {
		res, err := charge(context.Background(), c, "alice", "", &testpb.ChargeRequest{Account: "a", RequestId: "0190a0e0-0000-7000-8000-000000000077"})
		if err != nil || res.Msg.Run != 1 {
			t.Fatalf("try %d: %v %v, want run 1", try, res, err)
		}
	}
	if n := svc.runs.Load(); n != 1 {
		t.Fatalf("runs %d", n)
	}
}

// TestAEPKeyWithoutFirstSent: a caller that sets idempotency_key.key and
// leaves first_sent empty gets it filled in by the client interceptor, as
// idemgrpc's does (the server refuses a key without one), the same on
// every attempt; the caller's message is untouched.
func TestAEPKeyWithoutFirstSent(t *testing.T) {
	t.Parallel()
	_, srv := server(t, idemconnect.Config{})
	ci, err := idemconnect.NewClientInterceptor(idemconnect.ClientConfig{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, connect.WithInterceptors(ci))
	msg := &testpb.ShipRequest{Order: "o", IdempotencyKey: &testpb.IdempotencyKey{Key: "s-nofs"}}
	for try := range 2 {
		req := connect.NewRequest(msg)
		req.Header().Set("X-User", "alice")
		res, err := c.Ship(context.Background(), req)
		if err != nil || res.Msg.Run != 1 {
			t.Fatalf("try %d: %v %v", try, res, err)
		}
		if req.Msg != msg || msg.IdempotencyKey.FirstSent != nil {
			t.Fatal("the caller's request was changed")
		}
	}
}
