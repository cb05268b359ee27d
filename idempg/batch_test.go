package idempg_test

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/dropproxy"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// TestBatchOutcomes: in one batch, two Reserves of one key (the first wins,
// the second sees its pending record, as if it came second), a Complete by
// the holder and one by a stranger, and Extends, each with its own outcome.
func TestBatchOutcomes(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	ctx := t.Context()
	held := batchtest.Key("held")
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: held, Fingerprint: "fp", Token: "old", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	k := batchtest.Key("contended")
	got := batchtest.InOneBatch(t, s.Batcher(),
		batchtest.Reserve(ctx, s, k, "first", time.Minute),
		batchtest.Reserve(ctx, s, k, "second", time.Minute),
		batchtest.Call(func() error { return s.Extend(ctx, idemstore.ExtendParams{Key: held, Token: "old", Lease: time.Hour}) }),
		batchtest.Call(func() error {
			return s.Extend(ctx, idemstore.ExtendParams{Key: held, Token: "stranger", Lease: time.Hour})
		}),
		batchtest.Complete(ctx, s, held, "old", time.Hour),
		batchtest.Complete(ctx, s, held, "stranger", time.Hour),
	)
	if got[0].Err != nil || !got[0].Created {
		t.Fatalf("first Reserve: %+v, want created", got[0])
	}
	if got[1].Err != nil || got[1].Created || got[1].Record == nil || got[1].Record.Token != "first" || got[1].Record.State != idemstore.StatePending ||
		got[1].Record.ReadAt.IsZero() || got[1].Record.Key != k {
		t.Fatalf("second Reserve: %+v, want the first's pending record", got[1])
	}
	for i, want := range []error{nil, idemstore.ErrLeaseLost, nil, idemstore.ErrLeaseLost} {
		if r := got[2+i]; !errors.Is(r.Err, want) || (want == nil && r.Err != nil) {
			t.Fatalf("call %d on the held key: %v, want %v", 2+i, r.Err, want)
		}
	}
	if rec, err := s.Get(ctx, held); err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != "old" {
		t.Fatalf("held key after the batch: %+v, %v", rec, err)
	}
	if st, ok := s.BatchStats(); !ok || st.Batches != 1 || st.Batched != 6 {
		t.Fatalf("BatchStats() = %+v, %v; want the six calls in one batch", st, ok)
	}
}

// TestBatchManyRows: one batch with several Reserves (new keys, a pending
// key, a completed one) and several Completes; the records and a waiter's
// wake-up are as without batching.
func TestBatchManyRows(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	ctx := t.Context()
	seed := func(name, tok string) idemstore.Key {
		k := batchtest.Key(name)
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp-" + tok, Token: tok, Lease: time.Minute}); err != nil || !created {
			t.Fatalf("seed %s: %v %v", name, created, err)
		}
		return k
	}
	c1, c2, c3, pending, done := seed("c1", "t1"), seed("c2", "t2"), seed("c3", "t3"), seed("pending", "p"), seed("done", "d")
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: done, Token: "d", Response: &idemstore.Response{Status: 200, Body: []byte("done")}, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	woken, cancel, err := s.Subscribe(ctx, c2)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	got := batchtest.InOneBatch(t, s.Batcher(),
		batchtest.Reserve(ctx, s, batchtest.Key("new-a"), "na", time.Minute),
		batchtest.Reserve(ctx, s, batchtest.Key("new-b"), "nb", time.Minute),
		batchtest.Reserve(ctx, s, pending, "late", time.Minute),
		batchtest.Reserve(ctx, s, done, "later", time.Minute),
		batchtest.Complete(ctx, s, c1, "t1", time.Hour),
		batchtest.Complete(ctx, s, c2, "t2", time.Hour),
		batchtest.Complete(ctx, s, c3, "wrong", time.Hour),
	)
	for i, r := range got[:2] {
		if r.Err != nil || !r.Created {
			t.Fatalf("Reserve %d of a new key: %+v", i, r)
		}
	}
	if r := got[2]; r.Err != nil || r.Created || r.Record == nil || r.Record.Token != "p" || r.Record.State != idemstore.StatePending || r.Record.Fingerprint != "fp-p" {
		t.Fatalf("Reserve of a pending key: %+v", r)
	}
	if r := got[3]; r.Err != nil || r.Created || r.Record == nil || r.Record.State != idemstore.StateCompleted || string(r.Record.Response.Body) != "done" {
		t.Fatalf("Reserve of a completed key: %+v", r)
	}
	if got[4].Err != nil || got[5].Err != nil || !errors.Is(got[6].Err, idemstore.ErrLeaseLost) {
		t.Fatalf("Completes: %v, %v, %v; want nil, nil, ErrLeaseLost", got[4].Err, got[5].Err, got[6].Err)
	}
	for _, k := range []idemstore.Key{c1, c2} {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.State != idemstore.StateCompleted || rec.ExpiresAt.Sub(rec.UpdatedAt) != time.Hour || string(rec.Response.Body) != rec.Token {
			t.Fatalf("%s after the batch: %+v, %v", k.Key, rec, err)
		}
	}
	if rec, err := s.Get(ctx, c3); err != nil || rec.State != idemstore.StatePending {
		t.Fatalf("c3 after a stranger's Complete: %+v, %v", rec, err)
	}
	if rec, err := s.Get(ctx, batchtest.Key("new-b")); err != nil || rec.Token != "nb" || rec.Request == nil || string(rec.Request.Body) != "nb" ||
		rec.LeaseUntil.Sub(rec.CreatedAt) != time.Minute {
		t.Fatalf("new-b after the batch: %+v, %v", rec, err)
	}
	<-woken // the waiter of c2 is told; the test times out otherwise
}

// TestBatchPoisonCallRunsAlone: a value the server refuses (a NUL byte in
// text) fails its own call only; the others in its batch succeed.
func TestBatchPoisonCallRunsAlone(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	batchtest.PoisonRunsAlone(t, s, s.Batcher(), batchtest.Key("poi\x00son"))
}

// TestBatchUnreachable: a batch whose connection cannot be had fails every
// member with ErrUnavailable.
func TestBatchUnreachable(t *testing.T) {
	t.Parallel()
	s, err := idempg.New(closedPortPool(t), idempg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()
	got := batchtest.InOneBatch(t, s.Batcher(), batchtest.Reserve(ctx, s, batchtest.Key("a"), "a", time.Minute), batchtest.Complete(ctx, s, batchtest.Key("b"), "b", time.Hour))
	for i, r := range got {
		if !errors.Is(r.Err, idemstore.ErrUnavailable) || r.Created {
			t.Fatalf("member %d: %+v, want ErrUnavailable", i, r)
		}
	}
}

// proxiedPool returns a one-connection pool to the test server through a
// dropproxy.
func proxiedPool(t *testing.T) (*pgxpool.Pool, *dropproxy.Proxy) {
	t.Helper()
	cfg := testPool(t, "").Config().ConnConfig
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	proxy := dropproxy.New(t, addr)
	pcfg, err := pgxpool.ParseConfig(strings.Replace(testURL(t), addr, proxy.Addr(), 1))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 1 // one connection, whose statement cache the warm-up fills
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, proxy
}

// TestBatchLostCommit: the server commits a batch and the reply is lost.
// No member may say that nothing changed (ErrRetryable) nor that it
// succeeded: each gets ErrUnavailable, and the reservation, which is
// there, is released by the token as the contract asks.
func TestBatchLostCommit(t *testing.T) {
	t.Parallel()
	pool, proxy := proxiedPool(t)
	schema := newSchema(t, pool)
	s, err := idempg.New(pool, idempg.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()
	// Warm up: the batch's statements are prepared, so that the proxy sees
	// the next batch's COMMIT as the first one it is armed for.
	batchtest.InOneBatch(t, s.Batcher(), batchtest.Reserve(ctx, s, batchtest.Key("w1"), "w1", time.Minute), batchtest.Reserve(ctx, s, batchtest.Key("w2"), "w2", time.Minute))
	proxy.DropNextCommit()
	got := batchtest.InOneBatch(t, s.Batcher(), batchtest.Reserve(ctx, s, batchtest.Key("lostreply"), "t1", time.Minute), batchtest.Reserve(ctx, s, batchtest.Key("other"), "t2", time.Minute))
	if proxy.Armed() {
		t.Fatal("the proxy did not see the batch")
	}
	batchtest.CommitUnknown(t, s, got, []idemstore.Key{batchtest.Key("lostreply"), batchtest.Key("other")}, []string{"t1", "t2"})
}

// TestBatchMemberLeavesThenReleases: a Reserve whose context ends while its
// batch waits on a row lock returns the context's error; the batch still
// commits it, and the release that follows finds it.
func TestBatchMemberLeavesThenReleases(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{})
	ctx := t.Context()
	batchtest.LeaveThenRelease(t, s, s.Batcher(), func(held idemstore.Key) func() {
		blocker, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := blocker.Exec(ctx, "SELECT FROM "+pgx.Identifier{schema, "idem_records"}.Sanitize()+" WHERE key = $1 FOR UPDATE", held.Key); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := blocker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestBatchDisabled: with DisableBatch the store has no batcher.
func TestBatchDisabled(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{DisableBatch: true})
	if s.Batcher() != nil {
		t.Fatal("DisableBatch: the store still batches")
	}
	if st, ok := s.BatchStats(); ok {
		t.Fatalf("DisableBatch: BatchStats() = %+v, true", st)
	}
}
