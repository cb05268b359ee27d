package idemmysql_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/dropproxy"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// TestBatchOutcomes puts every kind of batched call in one batch, in two
// rounds (two calls on some keys), with holders and strangers, and checks
// each caller's outcome and each record.
func TestBatchOutcomes(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, "")
	ctx := t.Context()
	seed := func(name, tok string) idemstore.Key {
		k := batchtest.Key(name)
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute}); err != nil || !created {
			t.Fatalf("seed %s: %v %v", name, created, err)
		}
		return k
	}
	c1, c2 := seed("complete-1", "c1"), seed("complete-2", "c2")
	esc, ext, rel := seed("escalate", "e"), seed("extend", "x"), seed("release", "r")
	fresh, contended := batchtest.Key("fresh"), batchtest.Key("contended")
	before, err := s.Get(ctx, ext)
	if err != nil {
		t.Fatal(err)
	}
	got := batchtest.InOneBatch(t, s.Batcher(),
		batchtest.Reserve(ctx, s, contended, "first", time.Minute),  // 0: wins
		batchtest.Reserve(ctx, s, contended, "second", time.Minute), // 1: sees first's
		batchtest.Reserve(ctx, s, fresh, "fresh", -time.Second),     // 2: created, expired lease
		batchtest.Reserve(ctx, s, c1, "late", time.Minute),          // 3: sees c1's pending record
		batchtest.Complete(ctx, s, c1, "c1", time.Hour),             // 4
		batchtest.Complete(ctx, s, c2, "c2", 2*time.Hour),           // 5: another retention
		batchtest.Complete(ctx, s, c2, "c2", time.Hour),             // 6: second round: already completed
		batchtest.Complete(ctx, s, c1, "stranger", time.Hour),       // 7: second round: lost
		func() batchtest.Result { // 8
			return batchtest.Result{Err: s.Escalate(ctx, idemstore.EscalateParams{Key: esc, Token: "e", Reason: "unknown outcome"})}
		},
		func() batchtest.Result { // 9
			return batchtest.Result{Err: s.Extend(ctx, idemstore.ExtendParams{Key: ext, Token: "x", Lease: time.Hour})}
		},
		func() batchtest.Result { // 10
			return batchtest.Result{Err: s.Release(ctx, idemstore.ReleaseParams{Key: rel, Token: "r"})}
		},
		func() batchtest.Result { // 11: second round on rel: gone
			return batchtest.Result{Err: s.Release(ctx, idemstore.ReleaseParams{Key: rel, Token: "r"})}
		},
		func() batchtest.Result { // 12: stranger on ext
			return batchtest.Result{Err: s.Extend(ctx, idemstore.ExtendParams{Key: ext, Token: "nobody", Lease: time.Hour})}
		},
	)
	if got[0].Err != nil || !got[0].Created {
		t.Fatalf("first Reserve: %+v", got[0])
	}
	if r := got[1]; r.Err != nil || r.Created || r.Record == nil || r.Record.Token != "first" || r.Record.State != idemstore.StatePending || r.Record.ReadAt.IsZero() {
		t.Fatalf("second Reserve: %+v, want the first's pending record", r)
	}
	if got[2].Err != nil || !got[2].Created {
		t.Fatalf("fresh Reserve: %+v", got[2])
	}
	if r := got[3]; r.Err != nil || r.Created || r.Record == nil || r.Record.Token != "c1" {
		t.Fatalf("Reserve of a held key: %+v", r)
	}
	for i, want := range map[int]error{4: nil, 5: nil, 6: idemstore.ErrLeaseLost, 7: idemstore.ErrLeaseLost, 8: nil, 9: nil, 10: nil, 11: idemstore.ErrLeaseLost, 12: idemstore.ErrLeaseLost} {
		if err := got[i].Err; (want == nil) != (err == nil) || !errors.Is(err, want) {
			t.Errorf("call %d: %v, want %v", i, err, want)
		}
	}
	if st, ok := s.BatchStats(); !ok || st.Batches != 1 || st.Batched != 13 {
		t.Fatalf("BatchStats() = %+v, %v; want one batch of 13", st, ok)
	}

	rec := get(t, s, contended)
	if rec.Token != "first" || rec.Fingerprint != "fp-first" || rec.Request == nil || string(rec.Request.Body) != "first" {
		t.Errorf("contended: %+v", rec)
	}
	if rec := get(t, s, fresh); !rec.LeaseExpired() {
		t.Errorf("fresh: lease until %v read at %v, want expired", rec.LeaseUntil, rec.ReadAt)
	}
	for k, retention := range map[idemstore.Key]time.Duration{c1: time.Hour, c2: 2 * time.Hour} {
		rec := get(t, s, k)
		if rec.State != idemstore.StateCompleted || rec.Response == nil || string(rec.Response.Body) != rec.Token {
			t.Errorf("%s: %+v", k.Key, rec)
		}
		if d := rec.ExpiresAt.Sub(rec.UpdatedAt); d != retention {
			t.Errorf("%s: expires %v after its completion, want %v", k.Key, d, retention)
		}
	}
	if rec := get(t, s, esc); rec.State != idemstore.StateNeedsReview || rec.Reason != "unknown outcome" {
		t.Errorf("escalated: %+v", rec)
	}
	if rec := get(t, s, ext); rec.LeaseUntil.Sub(rec.UpdatedAt) != time.Hour || !rec.UpdatedAt.After(before.UpdatedAt.Add(-time.Millisecond)) {
		t.Errorf("extended: lease until %v, updated %v", rec.LeaseUntil, rec.UpdatedAt)
	}
	if _, err := s.Get(ctx, rel); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("released: %v", err)
	}
}

// TestBatchPoisonCallRunsAlone: a call the server refuses (here a trigger
// refuses one key) fails alone; the others in its batch succeed.
func TestBatchPoisonCallRunsAlone(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, "")
	if _, err := db.ExecContext(t.Context(), "CREATE TRIGGER refuse_poison BEFORE INSERT ON idem_records FOR EACH ROW "+
		"BEGIN IF NEW.`key` = 'poison' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poison key refused'; END IF; END"); err != nil {
		t.Fatal(err)
	}
	batchtest.PoisonRunsAlone(t, s, s.Batcher(), batchtest.Key("poison"))
}

// TestBatchLargeValuesRunAlone: a value that could exceed the server's
// packet limit never joins a batch: it runs at once, alone, even while a
// batch is under way.
func TestBatchLargeValuesRunAlone(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, "")
	ctx := t.Context()
	k := batchtest.Key("large")
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "t", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	p := s.Batcher().Pause() // a batch would wait for Resume
	defer p.Resume()
	body := bytes.Repeat([]byte("x"), 1<<20)
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t", Response: &idemstore.Response{Status: 200, Body: body}, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: batchtest.Key("large-req"), Fingerprint: "fp", Token: "u", Lease: time.Minute,
		Request: &idemstore.Request{Method: "POST", Body: body}}); err != nil || !created {
		t.Fatalf("Reserve with a large request: %v %v", created, err)
	}
	if rec := get(t, s, k); rec.State != idemstore.StateCompleted || len(rec.Response.Body) != len(body) {
		t.Fatalf("large answer: %s, %d bytes", rec.State, len(rec.Response.Body))
	}
}

// TestBatchUnreachable: a batch that cannot reach the server fails every
// member with ErrUnavailable.
func TestBatchUnreachable(t *testing.T) {
	t.Parallel()
	s, err := idemmysql.New(closedPortDB(t), idemmysql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	got := batchtest.InOneBatch(t, s.Batcher(), batchtest.Reserve(ctx, s, batchtest.Key("a"), "a", time.Minute), batchtest.Complete(ctx, s, batchtest.Key("b"), "b", time.Hour))
	for i, r := range got {
		if !errors.Is(r.Err, idemstore.ErrUnavailable) || r.Created {
			t.Fatalf("member %d: %+v, want ErrUnavailable", i, r)
		}
	}
}

// TestBatchLostCommit: the server commits a batch and the reply is lost.
// No member may say that nothing changed (ErrRetryable) nor that it
// succeeded: each gets ErrUnavailable, and the reservation, which is
// there, is released by the token as the contract asks.
func TestBatchLostCommit(t *testing.T) {
	t.Parallel()
	_, cfg := newDatabase(t, "")
	proxy := dropproxy.New(t, cfg.Addr)
	viaCfg := cfg.Clone()
	viaCfg.Addr = proxy.Addr()
	s, err := idemmysql.New(openDB(t, viaCfg), idemmysql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// The COMMIT command itself (COM_QUERY, 0x03), not the batch's SET
	// TRANSACTION ISOLATION LEVEL READ COMMITTED.
	proxy.DropNext([]byte("\x03COMMIT"))
	got := batchtest.InOneBatch(t, s.Batcher(), batchtest.Reserve(ctx, s, batchtest.Key("a"), "t1", time.Minute), batchtest.Reserve(ctx, s, batchtest.Key("b"), "t2", time.Minute))
	if proxy.Armed() {
		t.Fatal("the proxy did not see the batch's COMMIT")
	}
	batchtest.CommitUnknown(t, s, got, []idemstore.Key{batchtest.Key("a"), batchtest.Key("b")}, []string{"t1", "t2"})
}

// TestBatchMemberLeavesThenReleases: a Reserve whose context ends while its
// batch waits on a row lock returns the context's error; the batch still
// commits it, and the release that follows finds it.
func TestBatchMemberLeavesThenReleases(t *testing.T) {
	t.Parallel()
	s, db := newStore(t, "")
	ctx := t.Context()
	batchtest.LeaveThenRelease(t, s, s.Batcher(), func(held idemstore.Key) func() {
		blocker, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := blocker.ExecContext(ctx, "SELECT 1 FROM idem_records WHERE `key` = ? FOR UPDATE", held.Key); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := blocker.Rollback(); err != nil {
				t.Fatal(err)
			}
		}
	})
}
