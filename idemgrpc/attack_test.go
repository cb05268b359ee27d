package idemgrpc_test

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestMessageAtSizeLimit: a request of exactly the server's receive limit
// is fingerprinted, runs once and replays; one byte more is refused by
// grpc before idem sees it, and nothing is reserved. An answer over
// EngineConfig.MaxResponseBody runs once and is not replayable
// (ALREADY_EXISTS).
func TestMessageAtSizeLimit(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	ev := newEnv(t, idemgrpc.Config{}, envOptions{server: []grpc.ServerOption{grpc.MaxRecvMsgSize(limit)}, engine: idem.EngineConfig{MaxResponseBody: limit / 2}})
	ev.svc.charge = func(_ context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		return &testpb.Payment{Run: run, Note: req.Note}, nil
	}
	req := &testpb.ChargeRequest{Account: "a", RequestId: uuid(1)}
	req.Note = bytes.Repeat([]byte{'x'}, limit-proto.Size(req)-4)
	for proto.Size(req) < limit {
		req.Note = append(req.Note, 'x')
	}
	if proto.Size(req) != limit {
		t.Fatalf("size %d", proto.Size(req))
	}
	small := &testpb.ChargeRequest{Account: "a", RequestId: uuid(2), Note: bytes.Repeat([]byte{'y'}, 100)}
	for i := 0; i < 2; i++ {
		if _, err := ev.client.Charge(as("alice"), small); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ev.client.Charge(as("alice"), req); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	_, err := ev.client.Charge(as("alice"), req) // its answer was too large to keep
	wantCode(t, err, codes.AlreadyExists, idemgrpc.ReasonNotReplayable)
	over := proto.Clone(req).(*testpb.ChargeRequest)
	over.RequestId, over.Note = uuid(3), append(over.Note, 'x')
	_, err = ev.client.Charge(as("alice"), over)
	wantCode(t, err, codes.ResourceExhausted, "")
	if n := ev.svc.runs.Load(); n != 2 {
		t.Fatalf("runs %d, want 2", n)
	}
	if ev.store.(interface{ Len() int }).Len() != 2 {
		t.Fatal("the oversized call reserved a key")
	}
}

// TestUnknownFields: a newer client's request, with fields this server
// does not know (a map among them, whose order changes from one encoding
// to the next), retried with other values in those fields, gets the first
// answer: the server never read them.
func TestUnknownFields(t *testing.T) {
	t.Parallel()
	ev := newEnv(t, idemgrpc.Config{}, envOptions{})
	send := func(memo string, extra map[string]string) (*testpb.Payment, error) {
		out := new(testpb.Payment)
		err := ev.conn.Invoke(as("alice"), chargeMethod, &testpb.ChargeRequestV2{Account: "a", Amount: 5, RequestId: uuid(1), Memo: memo, Extra: extra}, out)
		return out, err
	}
	extra := map[string]string{}
	for i := 0; i < 50; i++ {
		extra[string(rune('a'+i%26))+string(rune('a'+i/26))] = "v"
	}
	p1, err := send("first", extra)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := send("second", extra)
	if err != nil || !proto.Equal(p1, p2) || ev.svc.runs.Load() != 1 {
		t.Fatalf("retry %v %v, runs %d", p2, err, ev.svc.runs.Load())
	}
}

// TestClientCancelsMidCall: a client that gives up while the handler runs
// cancels the handler's context, and its call never runs twice: a retry
// while the handler still runs is IN_FLIGHT. A handler that then returns
// the context's error leaves its outcome unknown: the key goes to review.
// One that finishes its work regardless has its answer stored, and the
// retry gets it.
func TestClientCancelsMidCall(t *testing.T) {
	t.Parallel()
	for _, finish := range []bool{false, true} {
		ev := newEnv(t, idemgrpc.Config{}, envOptions{})
		entered, release := make(chan struct{}), make(chan struct{})
		ev.svc.charge = func(ctx context.Context, _ *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
			if run == 1 {
				close(entered)
				<-ctx.Done()
				<-release
				if !finish {
					return nil, status.FromContextError(ctx.Err()).Err()
				}
			}
			return &testpb.Payment{Run: run}, nil
		}
		ctx, cancel := context.WithCancel(as("alice"))
		done := make(chan error)
		go func() {
			_, err := ev.client.Charge(ctx, &testpb.ChargeRequest{RequestId: uuid(1)})
			done <- err
		}()
		<-entered
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled {
			t.Fatalf("cancelled call: %v", err)
		}
		_, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{RequestId: uuid(1)})
		wantCode(t, err, codes.Aborted, idemgrpc.ReasonInFlight)
		if e := ev.event(); e.Outcome != "in_flight" {
			t.Fatalf("retry while the handler runs: %+v", e)
		}
		close(release)
		e := ev.event()
		p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{RequestId: uuid(1)})
		switch {
		case finish && (e.Settlement != "completed" || err != nil || p.Run != 1):
			t.Fatalf("finished: %+v, retry %v %v", e, p, err)
		case !finish && (e.Settlement != "escalated" || e.Code != codes.Canceled):
			t.Fatalf("gave up: %+v", e)
		case !finish:
			wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
		}
		if n := ev.svc.runs.Load(); n != 1 {
			t.Fatalf("runs %d", n)
		}
	}
}

// TestServerKilledAfterComplete: the server stores the answer, then dies
// before the reply reaches the client. The client's retry, with the same
// key, reaches a new server over the same store and gets the stored answer;
// the handler ran once.
func TestServerKilledAfterComplete(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	killed := make(chan struct{})
	var ev *env
	kill := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req) // idem has stored the answer
		go ev.server.Stop()      // the process dies before it replies
		close(killed)
		<-ctx.Done()
		return resp, err
	}
	ev = newEnv(t, idemgrpc.Config{}, envOptions{store: store, outer: []grpc.UnaryServerInterceptor{kill}, client: []grpc.DialOption{
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{BaseDelay: time.Millisecond, MaxAttempts: 50})),
	}})
	go func() { // a new server on the same address, over the same store
		<-killed
		e, _ := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
		s := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(e, idemgrpc.Config{Scope: userScope, Logger: quiet})))
		testpb.RegisterPaymentsServer(s, ev.svc)
		for {
			lis, err := net.Listen("tcp", ev.addr)
			if err == nil {
				t.Cleanup(s.Stop)
				s.Serve(lis)
				return
			}
		}
	}()
	var info idemgrpc.CallInfo
	p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a"}, idemgrpc.WithCallInfo(&info), grpc.WaitForReady(true))
	if err != nil || p.Run != 1 || !info.Replayed || info.Attempts < 2 || ev.svc.runs.Load() != 1 {
		t.Fatalf("%v %v %+v runs %d", p, err, info, ev.svc.runs.Load())
	}
}

// TestCompleteTxInHandler: a handler completes its key with the store's
// CompleteTx inside its own transaction; the retry gets what committed.
// A transaction that rolls back after CompleteTx releases a Transactional
// key, and the retry runs again.
func TestCompleteTxInHandler(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE charges (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	ev := newEnv(t, idemgrpc.Config{Policy: idemgrpc.Policy{Kind: idem.Transactional}}, envOptions{store: store})
	var rolledBack atomic.Bool
	ev.svc.charge = func(ctx context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		p := &testpb.Payment{Id: req.RequestId, Run: run}
		if _, err := tx.ExecContext(ctx, `INSERT INTO charges (id) VALUES (?)`, p.Id); err != nil {
			return nil, err
		}
		resp, err := idemgrpc.Response(p)
		if err != nil {
			return nil, err
		}
		if err := store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), resp); err != nil {
			return nil, err
		}
		if req.Account == "rollback" && !rolledBack.Swap(true) {
			return nil, status.Error(codes.Internal, "the commit failed") // tx rolls back
		}
		return p, tx.Commit()
	}
	for _, account := range []string{"ok", "rollback"} {
		ctx := as("alice")
		key := uuid(len(account))
		_, err := ev.client.Charge(ctx, &testpb.ChargeRequest{Account: account, RequestId: key})
		if e := ev.event(); (account == "ok") != (e.Settlement == "completed_tx") || (account == "rollback" && e.Settlement != "released") {
			t.Fatalf("%s: %+v %v", account, e, err)
		}
		p, err := ev.client.Charge(ctx, &testpb.ChargeRequest{Account: account, RequestId: key})
		if err != nil || p.Id != key {
			t.Fatalf("%s: retry %v %v", account, p, err)
		}
		ev.event()
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n)
	if n != 2 || ev.svc.runs.Load() != 3 {
		t.Fatalf("%d charges, %d runs", n, ev.svc.runs.Load())
	}
}
