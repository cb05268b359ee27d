package idemgrpc_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/testenv"
)

// pgLedger is a PostgreSQL schema of its own for one test: idem's records,
// and the business table charges beside them. Its unique constraint on
// account is checked at commit (DEFERRABLE INITIALLY DEFERRED), so that a
// test can make a transaction fail at COMMIT, after CompleteTx.
type pgLedger struct {
	pool   *pgxpool.Pool
	schema string
	store  *idempg.Store
}

func newPGLedger(t testing.TB) *pgLedger {
	t.Helper()
	u := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	_, _ = rand.Read(b[:])
	l := &pgLedger{pool: pool, schema: "idemgrpc_t_" + hex.EncodeToString(b[:])}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+l.schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	cfg := idempg.Config{Schema: l.schema}
	if err := idempg.Migrate(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+l.schema+`.charges (
		id text PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL,
		CONSTRAINT one_per_account UNIQUE (account) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	if l.store, err = idempg.New(pool, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.store.Close() })
	return l
}

// charge books req in one transaction with its answer: the business row,
// then CompleteTx, then, unless rollback says otherwise, COMMIT. It returns
// the commit's error.
func (l *pgLedger) charge(ctx context.Context, req *testpb.ChargeRequest, run int64, rollback bool) (*testpb.Payment, error) {
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	p := &testpb.Payment{Id: "pay_" + req.RequestId, Account: req.Account, Amount: req.Amount, Run: run}
	if _, err := tx.Exec(ctx, `INSERT INTO `+l.schema+`.charges (id, account, amount) VALUES ($1, $2, $3)`, p.Id, p.Account, p.Amount); err != nil {
		return nil, err
	}
	resp, err := idemgrpc.Response(p)
	if err != nil {
		return nil, err
	}
	if err := l.store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), resp); err != nil {
		return nil, err // the lease was lost: roll back
	}
	if rollback {
		return nil, status.Error(codes.Internal, "the handler failed after CompleteTx")
	}
	return p, tx.Commit(ctx)
}

// rows counts the business rows of id.
func (l *pgLedger) rows(t *testing.T, id string) int {
	t.Helper()
	var n int
	if err := l.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+l.schema+`.charges WHERE id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// state is the state of key's record, or "absent".
func (l *pgLedger) state(t *testing.T, method, key string) idemstore.State {
	t.Helper()
	rec, err := l.store.Get(context.Background(), idemstore.Key{Scope: "user:alice", Operation: method, Key: key})
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return "absent"
	case err != nil:
		t.Fatal(err)
	}
	return rec.State
}

// TestCompleteTxPostgres: a gRPC handler books a charge and stores its
// answer with idempg's CompleteTx in one PostgreSQL transaction.
//
//   - It commits: the row and the completed record are there together, and
//     the retry gets the committed answer, replayed, without running.
//   - It fails after CompleteTx and rolls back: neither the row nor an
//     answer is left, the Transactional key is released, and the retry
//     runs and commits.
//   - COMMIT itself fails (a deferred constraint): the interceptor reads
//     back that nothing committed and releases the key; nothing is left.
//   - An External method that rolls back after CompleteTx goes to review:
//     its effect outside the database may have happened.
func TestCompleteTxPostgres(t *testing.T) {
	t.Parallel()
	l := newPGLedger(t)
	if _, err := l.pool.Exec(context.Background(), `INSERT INTO `+l.schema+`.charges (id, account, amount) VALUES ('pay_0', 'taken', 1)`); err != nil {
		t.Fatal(err)
	}
	ev := newEnv(t, idemgrpc.Config{Methods: map[string]idemgrpc.Policy{
		chargeMethod: {Kind: idem.Transactional},
		refundMethod: {Kind: idem.External},
	}}, envOptions{store: l.store})
	var mu sync.Mutex
	failures := map[string]int{"rollback": 1} // handler failures left, by account
	ev.svc.charge = func(ctx context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		mu.Lock()
		rollback := failures[req.Account] > 0
		failures[req.Account]--
		mu.Unlock()
		return l.charge(ctx, req, run, rollback)
	}
	ev.svc.refund = func(ctx context.Context, req *testpb.RefundRequest, run int64) (*testpb.RefundResult, error) {
		_, err := l.charge(ctx, &testpb.ChargeRequest{Account: "external", Amount: -req.Amount, RequestId: req.Charge}, run, true)
		return nil, err
	}
	call := func(account, key string) (*testpb.Payment, metadata.MD, error) {
		var h metadata.MD
		p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: account, Amount: 5, RequestId: key}, grpc.Header(&h))
		return p, h, err
	}

	// Commits: row and answer together; the retry replays.
	first, _, err := call("ok", uuid(1))
	if err != nil {
		t.Fatal(err)
	}
	if e := ev.event(); e.Settlement != "completed_tx" {
		t.Fatalf("commit: %+v", e)
	}
	if l.rows(t, "pay_"+uuid(1)) != 1 || l.state(t, chargeMethod, uuid(1)) != idemstore.StateCompleted {
		t.Fatalf("commit: rows %d, record %s", l.rows(t, "pay_"+uuid(1)), l.state(t, chargeMethod, uuid(1)))
	}
	again, h, err := call("ok", uuid(1))
	if err != nil || !proto.Equal(first, again) || !idemgrpc.Replayed(h) {
		t.Fatalf("replay of the commit: %v %v %v", again, err, h)
	}
	ev.event()

	// Rolls back after CompleteTx: nothing is left; the retry runs.
	_, _, err = call("rollback", uuid(2))
	wantCode(t, err, codes.Internal, "")
	if e := ev.event(); e.Settlement != "released" {
		t.Fatalf("rollback: %+v", e)
	}
	if l.rows(t, "pay_"+uuid(2)) != 0 || l.state(t, chargeMethod, uuid(2)) != "absent" {
		t.Fatalf("rollback: rows %d, record %s", l.rows(t, "pay_"+uuid(2)), l.state(t, chargeMethod, uuid(2)))
	}
	retried, _, err := call("rollback", uuid(2))
	if err != nil || retried.Run != 3 {
		t.Fatalf("retry after the rollback: %v %v", retried, err)
	}
	ev.event()
	if l.rows(t, "pay_"+uuid(2)) != 1 || l.state(t, chargeMethod, uuid(2)) != idemstore.StateCompleted {
		t.Fatal("the retry's commit left no row or no answer")
	}

	// COMMIT fails: nothing committed, and the key is released.
	_, _, err = call("taken", uuid(3))
	if status.Code(err) == codes.OK {
		t.Fatal("a commit that violates the constraint succeeded")
	}
	if e := ev.event(); e.Settlement != "released" {
		t.Fatalf("failed commit: %+v", e)
	}
	if l.rows(t, "pay_"+uuid(3)) != 0 || l.state(t, chargeMethod, uuid(3)) != "absent" {
		t.Fatalf("failed commit: rows %d, record %s", l.rows(t, "pay_"+uuid(3)), l.state(t, chargeMethod, uuid(3)))
	}

	// External, rolled back after CompleteTx: to review.
	_, err = ev.client.Refund(as("alice", "refund-1"), &testpb.RefundRequest{Charge: uuid(4), Amount: 5})
	wantCode(t, err, codes.Internal, "")
	if e := ev.event(); e.Settlement != "escalated" {
		t.Fatalf("external rollback: %+v", e)
	}
	_, err = ev.client.Refund(as("alice", "refund-1"), &testpb.RefundRequest{Charge: uuid(4), Amount: 5})
	wantCode(t, err, codes.FailedPrecondition, idemgrpc.ReasonNeedsReview)
	if l.rows(t, "pay_"+uuid(4)) != 0 || l.state(t, refundMethod, "refund-1") != idemstore.StateNeedsReview {
		t.Fatalf("external rollback: rows %d, record %s", l.rows(t, "pay_"+uuid(4)), l.state(t, refundMethod, "refund-1"))
	}
	if n := ev.svc.runs.Load(); n != 5 {
		t.Fatalf("runs %d, want 5", n)
	}
}

// TestCompleteTxPostgresKilledAfterCommit: the handler's transaction
// commits the row and the answer, and the server dies before the reply
// leaves. The client's retry, with the same key, reaches a new server over
// the same database and gets the committed answer; the charge is booked
// once.
func TestCompleteTxPostgresKilledAfterCommit(t *testing.T) {
	t.Parallel()
	l := newPGLedger(t)
	killed := make(chan struct{})
	var ev *env
	kill := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req) // committed
		go ev.server.Stop()      // the process dies before it replies
		close(killed)
		<-ctx.Done()
		return resp, err
	}
	cfg := idemgrpc.Config{Policy: idemgrpc.Policy{Kind: idem.Transactional}}
	ev = newEnv(t, cfg, envOptions{store: l.store, outer: []grpc.UnaryServerInterceptor{kill}, client: []grpc.DialOption{
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{BaseDelay: time.Millisecond, MaxAttempts: 50})),
	}})
	ev.svc.charge = func(ctx context.Context, req *testpb.ChargeRequest, run int64) (*testpb.Payment, error) {
		return l.charge(ctx, req, run, false)
	}
	restarted := make(chan *grpc.Server, 1)
	go func() { // a new process on the same address, over the same database
		<-killed
		e, _ := idem.NewEngine(l.store, idem.EngineConfig{Logger: quiet})
		cfg.Scope, cfg.Logger = userScope, quiet
		s := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(e, cfg)))
		testpb.RegisterPaymentsServer(s, ev.svc)
		restarted <- s
		for {
			if lis, err := net.Listen("tcp", ev.addr); err == nil {
				s.Serve(lis)
				return
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case s := <-restarted:
			s.Stop()
		default: // never killed: the test has failed
		}
	})
	var info idemgrpc.CallInfo
	p, err := ev.client.Charge(as("alice"), &testpb.ChargeRequest{Account: "a", Amount: 5}, idemgrpc.WithCallInfo(&info), grpc.WaitForReady(true))
	if err != nil || p.Run != 1 || !info.Replayed || info.Attempts < 2 || ev.svc.runs.Load() != 1 {
		t.Fatalf("%v %v %+v, runs %d", p, err, info, ev.svc.runs.Load())
	}
	if n := l.rows(t, "pay_"+info.Key); n != 1 {
		t.Fatalf("%d rows booked", n)
	}
}
