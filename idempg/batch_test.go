package idempg_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/dropproxy"
)

// batchResult is what one call of a batch returned.
type batchResult struct {
	rec     *idemstore.Record
	created bool
	err     error
}

// inOneBatch makes the calls, each from its own goroutine, while the
// store's batcher is paused, so that they all run in one batch, and
// returns what each got.
func inOneBatch(t *testing.T, s *idempg.Store, calls ...func() batchResult) []batchResult {
	t.Helper()
	p := s.Batcher().Pause()
	out := make([]batchResult, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() { out[i] = call() })
		p.Wait(i + 1)
	}
	p.Resume()
	wg.Wait()
	return out
}

func reserveCall(ctx context.Context, s idemstore.Store, k idemstore.Key, tok string) func() batchResult {
	return func() batchResult {
		rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp-" + tok, Token: tok, Lease: time.Minute,
			Request: &idemstore.Request{Method: "POST", Path: "/x", Body: []byte(tok)}})
		return batchResult{rec, created, err}
	}
}

func completeCall(ctx context.Context, s idemstore.Store, k idemstore.Key, tok string) func() batchResult {
	return func() batchResult {
		return batchResult{err: s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok,
			Response: &idemstore.Response{Status: 201, Body: []byte(tok)}, Retention: time.Hour})}
	}
}

func extendCall(ctx context.Context, s idemstore.Store, k idemstore.Key, tok string) func() batchResult {
	return func() batchResult {
		return batchResult{err: s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: tok, Lease: time.Hour})}
	}
}

func testKey(name string) idemstore.Key {
	return idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: name}
}

// TestBatchOutcomes: in one batch, two Reserves of one key (the first wins,
// the second sees its pending record, as if it came second), a Complete by
// the holder and one by a stranger, and Extends, each with its own outcome.
func TestBatchOutcomes(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	ctx := t.Context()
	held := testKey("held")
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: held, Fingerprint: "fp", Token: "old", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	k := testKey("contended")
	got := inOneBatch(t, s,
		reserveCall(ctx, s, k, "first"),
		reserveCall(ctx, s, k, "second"),
		extendCall(ctx, s, held, "old"),
		extendCall(ctx, s, held, "stranger"),
		completeCall(ctx, s, held, "old"),
		completeCall(ctx, s, held, "stranger"),
	)
	if got[0].err != nil || !got[0].created {
		t.Fatalf("first Reserve: %+v, want created", got[0])
	}
	if got[1].err != nil || got[1].created || got[1].rec == nil || got[1].rec.Token != "first" || got[1].rec.State != idemstore.StatePending ||
		got[1].rec.ReadAt.IsZero() || got[1].rec.Key != k {
		t.Fatalf("second Reserve: %+v, want the first's pending record", got[1])
	}
	for i, want := range []error{nil, idemstore.ErrLeaseLost, nil, idemstore.ErrLeaseLost} {
		if r := got[2+i]; !errors.Is(r.err, want) || (want == nil && r.err != nil) {
			t.Fatalf("call %d on the held key: %v, want %v", 2+i, r.err, want)
		}
	}
	if rec, err := s.Get(ctx, held); err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != "old" {
		t.Fatalf("held key after the batch: %+v, %v", rec, err)
	}
	if batches, calls := s.Batcher().Stats(); batches != 1 || calls != 6 {
		t.Fatalf("Stats() = %d batches, %d calls; want the six calls in one batch", batches, calls)
	}
}

// TestBatchManyRows: one round with several Reserves (new keys, a pending
// key, a completed one) and several Completes, each in one multi-row
// statement; the records and a waiter's wake-up are as without batching.
func TestBatchManyRows(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	ctx := t.Context()
	seed := func(name, tok string) idemstore.Key {
		k := testKey(name)
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
	got := inOneBatch(t, s,
		reserveCall(ctx, s, testKey("new-a"), "na"),
		reserveCall(ctx, s, testKey("new-b"), "nb"),
		reserveCall(ctx, s, pending, "late"),
		reserveCall(ctx, s, done, "later"),
		completeCall(ctx, s, c1, "t1"),
		completeCall(ctx, s, c2, "t2"),
		completeCall(ctx, s, c3, "wrong"),
	)
	for i, r := range got[:2] {
		if r.err != nil || !r.created {
			t.Fatalf("Reserve %d of a new key: %+v", i, r)
		}
	}
	if r := got[2]; r.err != nil || r.created || r.rec == nil || r.rec.Token != "p" || r.rec.State != idemstore.StatePending || r.rec.Fingerprint != "fp-p" {
		t.Fatalf("Reserve of a pending key: %+v", r)
	}
	if r := got[3]; r.err != nil || r.created || r.rec == nil || r.rec.State != idemstore.StateCompleted || string(r.rec.Response.Body) != "done" {
		t.Fatalf("Reserve of a completed key: %+v", r)
	}
	if got[4].err != nil || got[5].err != nil || !errors.Is(got[6].err, idemstore.ErrLeaseLost) {
		t.Fatalf("Completes: %v, %v, %v; want nil, nil, ErrLeaseLost", got[4].err, got[5].err, got[6].err)
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
	if rec, err := s.Get(ctx, testKey("new-b")); err != nil || rec.Token != "nb" || rec.Request == nil || string(rec.Request.Body) != "nb" ||
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
	ctx := t.Context()
	got := inOneBatch(t, s,
		reserveCall(ctx, s, testKey("a"), "a"),
		reserveCall(ctx, s, testKey("poi\x00son"), "p"),
		reserveCall(ctx, s, testKey("z"), "z"),
	)
	if got[1].err == nil || errors.Is(got[1].err, idemstore.ErrRetryable) || errors.Is(got[1].err, idemstore.ErrUnavailable) {
		t.Fatalf("poison Reserve: %+v, want the server's refusal", got[1])
	}
	for _, i := range []int{0, 2} {
		if got[i].err != nil || !got[i].created {
			t.Fatalf("Reserve %d beside the poison: %+v, want created", i, got[i])
		}
	}
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
	got := inOneBatch(t, s, reserveCall(ctx, s, testKey("a"), "a"), completeCall(ctx, s, testKey("b"), "b"))
	for i, r := range got {
		if !errors.Is(r.err, idemstore.ErrUnavailable) || r.created {
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
	// Warm up: the batch's statements are prepared, so the next batch
	// sends only their parameters, in which the proxy looks for the key.
	inOneBatch(t, s, reserveCall(ctx, s, testKey("w1"), "w1"), reserveCall(ctx, s, testKey("w2"), "w2"))
	proxy.DropNext([]byte("LOSTREPLY"))
	got := inOneBatch(t, s, reserveCall(ctx, s, testKey("lostreply"), "t1"), reserveCall(ctx, s, testKey("other"), "t2"))
	if proxy.Armed() {
		t.Fatal("the proxy did not see the batch")
	}
	for i, r := range got {
		if r.err == nil || r.created || !errors.Is(r.err, idemstore.ErrUnavailable) || errors.Is(r.err, idemstore.ErrRetryable) {
			t.Fatalf("member %d after a lost commit reply: %+v; want ErrUnavailable, never ErrRetryable", i, r)
		}
	}
	for i, name := range []string{"lostreply", "other"} {
		tok := []string{"t1", "t2"}[i]
		rec, err := s.Get(ctx, testKey(name))
		if err != nil || rec.Token != tok {
			t.Fatalf("%s: %+v, %v; want the committed reservation", name, rec, err)
		}
		if err := s.Release(ctx, idemstore.ReleaseParams{Key: testKey(name), Token: tok}); err != nil {
			t.Fatalf("release of %s after the failed Reserve: %v", name, err)
		}
	}
}

// TestBatchMemberLeavesThenReleases: a Reserve whose context ends while its
// batch waits on a row lock returns the context's error; the batch still
// commits it. The release the contract then asks for queues behind that
// batch and finds the reservation.
func TestBatchMemberLeavesThenReleases(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{})
	ctx := t.Context()
	held := testKey("x-held")
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: held, Fingerprint: "fp", Token: "h", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := blocker.Exec(ctx, "SELECT FROM "+pgx.Identifier{schema, "idem_records"}.Sanitize()+" WHERE key = $1 FOR UPDATE", held.Key); err != nil {
		t.Fatal(err)
	}
	leaving, leave := context.WithCancel(ctx)
	p := s.Batcher().Pause()
	results := make(chan batchResult, 2)
	go func() { results <- reserveCall(leaving, s, testKey("left"), "left")() }()
	p.Wait(1)
	go func() { results <- completeCall(ctx, s, held, "h")() }()
	p.Wait(2)
	p.Resume() // both are taken; the batch waits on the row lock
	leave()
	if left := <-results; !errors.Is(left.err, context.Canceled) {
		t.Fatalf("member that left: %+v, want context.Canceled", left)
	}
	released := make(chan error)
	go func() { released <- s.Release(ctx, idemstore.ReleaseParams{Key: testKey("left"), Token: "left"}) }()
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if stayed := <-results; stayed.err != nil {
		t.Fatalf("member that stayed: %+v", stayed)
	}
	if err := <-released; err != nil {
		t.Fatalf("Release of the reservation whose Reserve failed: %v; want it found and released", err)
	}
	if _, err := s.Get(ctx, testKey("left")); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("released key: %v", err)
	}
}

// TestBatchDisabled: with DisableBatch the store has no batcher.
func TestBatchDisabled(t *testing.T) {
	t.Parallel()
	if s := newStore(t, testPool(t, ""), idempg.Config{DisableBatch: true}); s.Batcher() != nil {
		t.Fatal("DisableBatch: the store still batches")
	}
}
