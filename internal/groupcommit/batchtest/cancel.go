package batchtest

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit"
)

// The checks below end a claim's context (a Reserve's, a Takeover's) while
// its statement waits for a lock on the key, let the release of its token
// run and find nothing, and then let the lock go, so that the waiting
// statement can finish. The server must not commit the claim then: the
// record would stay pending under a token that nobody holds, and every
// retry would get InFlight (409) until the lease ran out.

// Hold is a lock on a key, held by a transaction of the test's own, that
// makes a store's statement on that key wait.
type Hold interface {
	// Waiter returns once a statement waits for the hold.
	Waiter(t testing.TB)
	// Unblock rolls the hold's transaction back: the waiter goes on.
	Unblock(t testing.TB)
	// Settled returns once the waiter's transaction has ended for good,
	// committed or rolled back.
	Settled(t testing.TB)
	// Kill ends the waiter's connection on the server.
	Kill(t testing.TB)
}

// Holder takes a Hold on k.
type Holder func(t testing.TB, k idemstore.Key) Hold

// quiet drops an engine's logs: the checks make its releases fail.
var quiet = slog.New(slog.DiscardHandler)

// engine returns an engine on s whose leases last an hour.
func engine(t testing.TB, s idemstore.Store) *idem.Engine {
	t.Helper()
	e, err := idem.NewEngine(s, idem.EngineConfig{Lease: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// NoOrphan fails the test if k has a pending record under token (any token
// when token is ""), which nobody holds.
func NoOrphan(t testing.TB, s idemstore.Store, k idemstore.Key, token string) {
	t.Helper()
	rec, err := s.Get(t.Context(), k)
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
	case err != nil:
		t.Fatal(err)
	case rec.State == idemstore.StatePending && (token == "" || rec.Token == token):
		t.Fatalf("%s is pending under token %q, which nobody holds, until %v: a claim whose caller had left was committed after it",
			k.Key, rec.Token, rec.LeaseUntil)
	}
}

// Acquires requires that a Begin of req acquires its key.
func Acquires(t testing.TB, e *idem.Engine, req idem.Request) {
	t.Helper()
	if res, err := e.Begin(t.Context(), req); err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Begin of %s: %v, %v; want Acquired", req.Key.Key, res.Outcome, err)
	}
}

// CancelledReserve: a Reserve, alone, whose context ends while its insert
// waits for a hold on its key (taken by hold, which must block an insert
// and not a release); the release of its token, as the engine makes it,
// finds nothing; then the hold goes. The reservation must not appear.
func CancelledReserve(t testing.TB, s idemstore.Store, hold Holder) {
	t.Helper()
	k := Key("cancelled")
	h := hold(t, k)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "abandoned", Lease: time.Hour})
		errc <- err
	}()
	h.Waiter(t)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve whose context ended while it waited: %v, want context.Canceled", err)
	}
	if err := s.Release(t.Context(), idemstore.ReleaseParams{Key: k, Token: "abandoned"}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("release after the failed Reserve: %v, want ErrLeaseLost (nothing there yet)", err)
	}
	h.Unblock(t)
	h.Settled(t)
	NoOrphan(t, s, k, "abandoned")
}

// CancelledBegin is CancelledReserve through an engine: Begin fails, its
// release of the fresh token finds nothing, and once the hold has gone the
// key must be free: a retry acquires it, instead of getting InFlight for
// the whole lease.
func CancelledBegin(t testing.TB, s idemstore.Store, kind idem.Kind, hold Holder) {
	t.Helper()
	e := engine(t, s)
	req := idem.Request{Key: Key("cancelled"), Fingerprint: "fp", Kind: kind}
	h := hold(t, req.Key)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := e.Begin(ctx, req)
		errc <- err
	}()
	h.Waiter(t)
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("Begin whose context ended while it waited succeeded")
	}
	h.Unblock(t)
	h.Settled(t)
	NoOrphan(t, s, req.Key, "")
	Acquires(t, e, req)
}

// KilledBegin: the connection of a Begin's Reserve that waits for a hold
// is ended on the server; then the hold goes. Begin fails with
// idemstore.ErrUnavailable, nothing commits, and a retry acquires the key.
func KilledBegin(t testing.TB, s idemstore.Store, hold Holder) {
	t.Helper()
	e := engine(t, s)
	req := idem.Request{Key: Key("killed"), Fingerprint: "fp"}
	h := hold(t, req.Key)
	errc := make(chan error, 1)
	go func() {
		_, err := e.Begin(t.Context(), req)
		errc <- err
	}()
	h.Waiter(t)
	h.Kill(t)
	if err := <-errc; !errors.Is(err, idemstore.ErrUnavailable) {
		t.Fatalf("Begin whose connection was ended: %v, want ErrUnavailable", err)
	}
	h.Unblock(t)
	h.Settled(t)
	NoOrphan(t, s, req.Key, "")
	Acquires(t, e, req)
}

// LostCommitReply: the store commits a lone Begin's reservation and the
// reply to its COMMIT is lost with the connection (lose arms that, and
// reports afterwards whether it happened). Begin fails with
// idemstore.ErrUnavailable, and its release of the fresh token, made once
// the server has answered the COMMIT, finds the reservation: nothing is
// left pending, and a retry acquires the key.
func LostCommitReply(t testing.TB, s idemstore.Store, lose func() (lost func() bool)) {
	t.Helper()
	e := engine(t, s)
	req := idem.Request{Key: Key("lost"), Fingerprint: "fp"}
	lost := lose()
	if _, err := e.Begin(t.Context(), req); !errors.Is(err, idemstore.ErrUnavailable) {
		t.Fatalf("Begin whose COMMIT reply was lost: %v, want ErrUnavailable", err)
	}
	if !lost() {
		t.Fatal("the Reserve's COMMIT reply was not lost")
	}
	NoOrphan(t, s, req.Key, "")
	Acquires(t, e, req)
}

// CancelledTakeover: a Takeover of an expired lease whose context ends
// while its statement waits for a hold on the record's row must not be
// applied once the hold goes. The engine releases the new token of a
// failed Takeover, and that release may not reach the server in time (it
// is bounded, and queues behind the store's batches).
func CancelledTakeover(t testing.TB, s idemstore.Store, hold Holder) {
	t.Helper()
	k := Key("expired")
	if _, _, err := s.Reserve(t.Context(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "old", Lease: -time.Minute}); err != nil {
		t.Fatal(err)
	}
	h := hold(t, k)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		errc <- s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "old", NewToken: "abandoned", Lease: time.Hour})
	}()
	h.Waiter(t)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Takeover whose context ended while it waited: %v, want context.Canceled", err)
	}
	h.Unblock(t)
	h.Settled(t)
	NoOrphan(t, s, k, "abandoned")
}

// CancelledBatch: every member of a batch of b leaves while the batch waits
// for a hold on one of its keys, so the batch's own context ends and its
// connection is dropped; the releases of the members' tokens find
// nothing. When the hold goes, what the batch wrote must not commit.
func CancelledBatch(t testing.TB, s idemstore.Store, b *groupcommit.Batcher, hold Holder) {
	t.Helper()
	a, held := Key("a"), Key("b")
	h := hold(t, held)
	ctx, cancel := context.WithCancel(t.Context())
	results := make(chan Result, 2)
	p := b.Pause()
	go func() { results <- Reserve(ctx, s, a, "ta", time.Hour)() }()
	p.Wait(1)
	go func() { results <- Reserve(ctx, s, held, "tb", time.Hour)() }()
	p.Wait(2)
	p.Resume()
	h.Waiter(t)
	cancel()
	for range 2 {
		if r := <-results; !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("member of a batch whose context ended: %+v, want context.Canceled", r)
		}
	}
	for k, tok := range map[idemstore.Key]string{a: "ta", held: "tb"} {
		if err := s.Release(t.Context(), idemstore.ReleaseParams{Key: k, Token: tok}); err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("release of %s: %v", k.Key, err)
		}
	}
	h.Unblock(t)
	h.Settled(t)
	NoOrphan(t, s, a, "ta")
	NoOrphan(t, s, held, "tb")
}

// CancelledBatchedBegin: Begin's Reserve runs in a batch of b beside a
// Complete that waits for a hold on its record's row, and Begin's context
// ends. The engine's release of its token queues behind that batch and
// gives up (it is bounded, and the hold lasts longer); Begin returns. Then
// the hold goes and the batch, which the Complete's caller still waits
// for, commits the reservation: it must not stay under a token nobody
// holds.
func CancelledBatchedBegin(t testing.TB, s idemstore.Store, b *groupcommit.Batcher, hold Holder) {
	t.Helper()
	e := engine(t, s)
	held := Key("held")
	if _, _, err := s.Reserve(t.Context(), idemstore.ReserveParams{Key: held, Fingerprint: "fp", Token: "h", Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	h := hold(t, held)
	ctx, cancel := context.WithCancel(t.Context())
	req := idem.Request{Key: Key("left"), Fingerprint: "fp"}
	begun := make(chan error, 1)
	completed := make(chan Result, 1)
	p := b.Pause()
	go func() {
		_, err := e.Begin(ctx, req)
		begun <- err
	}()
	p.Wait(1)
	go func() { completed <- Complete(t.Context(), s, held, "h", time.Hour)() }()
	p.Wait(2)
	p.Resume()
	h.Waiter(t)
	cancel()
	if err := <-begun; err == nil {
		t.Fatal("Begin whose context ended while its batch waited succeeded")
	}
	h.Unblock(t)
	if r := <-completed; r.Err != nil {
		t.Fatalf("the member that stayed: %v", r.Err)
	}
	NoOrphan(t, s, req.Key, "")
	Acquires(t, e, req)
}
