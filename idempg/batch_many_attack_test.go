package idempg_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// These tests attack the multi-row statements of a batch's round
// (reserveMany, completeMany): every caller must get its own outcome, by
// position, whatever the other rows of the statement do.

// holdInsert inserts a pending record for k under token in a transaction
// that stays open, so that a batch reserving k waits for it; it returns the
// backend's pid and ends the transaction with commit or rollback.
func holdInsert(t *testing.T, pool *pgxpool.Pool, schema string, k idemstore.Key, token string) (pid uint32, end func(commit bool)) {
	t.Helper()
	ctx := t.Context()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	err = tx.QueryRow(ctx, "INSERT INTO "+pgx.Identifier{schema, "idem_records"}.Sanitize()+
		` (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at)
VALUES ($1, $2, $3, 'fp-held', 'pending', $4, now() + interval '1 hour', now(), now()) RETURNING pg_backend_pid()`,
		k.Scope, k.Operation, k.Key, token).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid, func(commit bool) {
		end := tx.Rollback
		if commit {
			end = tx.Commit
		}
		if err := end(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// blockedBy returns the pid of a backend that waits for a lock that pid
// holds, once there is one; or 0 once done is closed.
func blockedBy(t *testing.T, pool *pgxpool.Pool, pid uint32, done <-chan struct{}) uint32 {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiter []uint32
		err := pool.QueryRow(t.Context(), "SELECT array_agg(pid) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid).Scan(&waiter)
		if err != nil {
			t.Fatal(err)
		}
		if len(waiter) > 0 {
			return waiter[0]
		}
		select {
		case <-done:
			return 0
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatalf("nothing blocked on backend %d", pid)
		}
	}
}

// inOneBatchAsync runs batchtest.InOneBatch on a goroutine of its own; the
// results arrive on the returned channel, which closes after them.
func inOneBatchAsync(t *testing.T, s *idempg.Store, calls ...func() batchtest.Result) <-chan []batchtest.Result {
	ch := make(chan []batchtest.Result, 1)
	go func() {
		defer close(ch)
		ch <- batchtest.InOneBatch(t, s.Batcher(), calls...)
	}()
	return ch
}

// wantRecord fails unless r is a Reserve that found the record of k in
// state with token.
func wantRecord(t *testing.T, what string, r batchtest.Result, k idemstore.Key, state idemstore.State, token string) {
	t.Helper()
	if r.Err != nil || r.Created || r.Record == nil || r.Record.Key != k || r.Record.State != state || r.Record.Token != token {
		t.Fatalf("%s: %+v (record %+v); want the %s record of %q under %q", what, r, r.Record, state, k.Key, token)
	}
}

// TestBatchManyOutcomesByPosition: one batch of fourteen calls whose
// rounds mix Reserves of new keys and of completed, pending and
// needs_review keys, a key called four times (Reserve, Reserve, Complete,
// Reserve), and Completes of which one lost its lease to another
// reservation. Each caller gets its own outcome, with or without notify.
func TestBatchManyOutcomesByPosition(t *testing.T) {
	t.Parallel()
	for _, notify := range []bool{true, false} {
		t.Run(fmt.Sprintf("notify=%v", notify), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, testPool(t, ""), idempg.Config{DisableNotify: !notify})
			ctx := t.Context()
			seed := func(name, tok string) idemstore.Key {
				k := batchtest.Key(name)
				if r := batchtest.Reserve(ctx, s, k, tok, time.Minute)(); r.Err != nil || !r.Created {
					t.Fatalf("seed %s: %+v", name, r)
				}
				return k
			}
			done, pend, review, lost := seed("done", "d"), seed("pend", "p"), seed("review", "r"), seed("lost", "old")
			c1, c2, c3 := seed("c1", "t1"), seed("c2", "t2"), seed("c3", "t3")
			if r := batchtest.Complete(ctx, s, done, "d", time.Hour)(); r.Err != nil {
				t.Fatal(r.Err)
			}
			if err := s.Escalate(ctx, idemstore.EscalateParams{Key: review, Token: "r", Reason: "why"}); err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, idemstore.ReleaseParams{Key: lost, Token: "old"}); err != nil {
				t.Fatal(err)
			}
			seed("lost", "new")
			n1, n2, n3, dup := batchtest.Key("n1"), batchtest.Key("n2"), batchtest.Key("n3"), batchtest.Key("dup")

			got := batchtest.InOneBatch(t, s.Batcher(),
				batchtest.Reserve(ctx, s, n1, "n1", time.Minute),      // 0
				batchtest.Reserve(ctx, s, done, "x1", time.Minute),    // 1
				batchtest.Reserve(ctx, s, n2, "n2", time.Minute),      // 2
				batchtest.Reserve(ctx, s, pend, "x2", time.Minute),    // 3
				batchtest.Reserve(ctx, s, review, "x3", time.Minute),  // 4
				batchtest.Reserve(ctx, s, dup, "first", time.Minute),  // 5
				batchtest.Reserve(ctx, s, dup, "second", time.Minute), // 6
				batchtest.Complete(ctx, s, dup, "first", time.Hour),   // 7
				batchtest.Reserve(ctx, s, dup, "third", time.Minute),  // 8
				batchtest.Complete(ctx, s, c1, "t1", time.Hour),       // 9
				batchtest.Complete(ctx, s, lost, "old", time.Hour),    // 10
				batchtest.Complete(ctx, s, c2, "t2", 2*time.Hour),     // 11
				batchtest.Complete(ctx, s, c3, "t3", 3*time.Hour),     // 12
				batchtest.Reserve(ctx, s, n3, "n3", time.Minute),      // 13
			)
			if st := s.Batcher().Stats(); st.Batches != 1 || st.Batched != 14 {
				t.Fatalf("Stats() = %+v; want the fourteen calls in one batch", st)
			}
			for _, i := range []int{0, 2, 5, 13} {
				if r := got[i]; r.Err != nil || !r.Created || r.Record != nil {
					t.Fatalf("Reserve %d of a new key: %+v, want created", i, r)
				}
			}
			wantRecord(t, "Reserve of a completed key", got[1], done, idemstore.StateCompleted, "d")
			if string(got[1].Record.Response.Body) != "d" || got[1].Record.Fingerprint != "fp-d" {
				t.Fatalf("Reserve of a completed key: %+v", got[1].Record)
			}
			wantRecord(t, "Reserve of a pending key", got[3], pend, idemstore.StatePending, "p")
			if got[3].Record.Fingerprint != "fp-p" || got[3].Record.Request == nil || string(got[3].Record.Request.Body) != "p" {
				t.Fatalf("Reserve of a pending key: %+v", got[3].Record)
			}
			wantRecord(t, "Reserve of a needs_review key", got[4], review, idemstore.StateNeedsReview, "r")
			if got[4].Record.Reason != "why" {
				t.Fatalf("Reserve of a needs_review key: reason %q", got[4].Record.Reason)
			}
			wantRecord(t, "second Reserve of dup", got[6], dup, idemstore.StatePending, "first")
			if got[7].Err != nil {
				t.Fatalf("Complete of dup by its holder: %v", got[7].Err)
			}
			wantRecord(t, "third Reserve of dup, after its Complete", got[8], dup, idemstore.StateCompleted, "first")
			if string(got[8].Record.Response.Body) != "first" {
				t.Fatalf("third Reserve of dup: answer %q", got[8].Record.Response.Body)
			}
			if !errors.Is(got[10].Err, idemstore.ErrLeaseLost) {
				t.Fatalf("Complete under a superseded token: %v, want ErrLeaseLost", got[10].Err)
			}
			for _, c := range []struct {
				i         int
				k         idemstore.Key
				retention time.Duration
			}{{9, c1, time.Hour}, {11, c2, 2 * time.Hour}, {12, c3, 3 * time.Hour}} {
				if got[c.i].Err != nil {
					t.Fatalf("Complete %d: %v", c.i, got[c.i].Err)
				}
				rec, err := s.Get(ctx, c.k)
				if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != rec.Token || rec.Response.Status != 201 ||
					rec.ExpiresAt.Sub(rec.UpdatedAt) != c.retention {
					t.Fatalf("%s after the batch: %+v, %v; want completed with its own answer, kept %v", c.k.Key, rec, err, c.retention)
				}
			}
			if rec, err := s.Get(ctx, lost); err != nil || rec.State != idemstore.StatePending || rec.Token != "new" {
				t.Fatalf("lost after a stale Complete: %+v, %v", rec, err)
			}
			for _, k := range []idemstore.Key{n1, n2, n3} {
				rec, err := s.Get(ctx, k)
				if err != nil || rec.State != idemstore.StatePending || rec.Token != k.Key || rec.Fingerprint != "fp-"+k.Key ||
					rec.Request == nil || string(rec.Request.Body) != k.Key {
					t.Fatalf("%s after the batch: %+v, %v", k.Key, rec, err)
				}
			}
		})
	}
}

// TestBatchManyWakesByPosition: a batch completes five keys, the first
// under a stale token; waiters listen on the first three. Exactly the
// payloads of the second and third are announced: completeMany takes each
// payload from the array by the call's position, not by the position of
// the changed row, and announces only the records it changed (the first
// Complete lost its lease and changed nothing).
func TestBatchManyWakesByPosition(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	channel := "idem_attack_" + randomHex(4)
	s := newStore(t, pool, idempg.Config{Channel: channel})
	ctx := t.Context()
	listen, err := pgx.Connect(ctx, testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = listen.Close(ctx) })
	if _, err := listen.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	var keys []idemstore.Key
	for _, name := range []string{"a", "b", "c", "d", "e", "fence"} {
		k := batchtest.Key(name)
		if r := batchtest.Reserve(ctx, s, k, "tok-"+name, time.Minute)(); r.Err != nil || !r.Created {
			t.Fatalf("seed %s: %+v", name, r)
		}
		keys = append(keys, k)
	}
	subscribe(t, s, keys[0])
	wakeB, wakeC, wakeFence := subscribe(t, s, keys[1]), subscribe(t, s, keys[2]), subscribe(t, s, keys[5])
	got := batchtest.InOneBatch(t, s.Batcher(),
		batchtest.Complete(ctx, s, keys[0], "stale", time.Hour),
		batchtest.Complete(ctx, s, keys[1], "tok-b", time.Hour),
		batchtest.Complete(ctx, s, keys[2], "tok-c", time.Hour),
		batchtest.Complete(ctx, s, keys[3], "tok-d", time.Hour),
		batchtest.Complete(ctx, s, keys[4], "tok-e", time.Hour),
	)
	if !errors.Is(got[0].Err, idemstore.ErrLeaseLost) {
		t.Fatalf("stale Complete: %v", got[0].Err)
	}
	for i, r := range got[1:] {
		if r.Err != nil {
			t.Fatalf("Complete %d: %v", i+1, r.Err)
		}
	}
	waitWake(t, wakeB, "b")
	waitWake(t, wakeC, "c")
	// A later transaction's notification arrives after the batch's: once
	// it is in, every payload the batch sent has been read.
	if r := batchtest.Complete(ctx, s, keys[5], "tok-fence", time.Hour)(); r.Err != nil {
		t.Fatal(r.Err)
	}
	waitWake(t, wakeFence, "fence")
	names := map[string]string{}
	for _, k := range keys {
		names[idempg.NotifyPayload(k)] = k.Key
	}
	var heard []string
	for {
		wctx, cancel := context.WithTimeout(ctx, wakeBound)
		n, err := listen.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("notifications so far %v, then: %v", heard, err)
		}
		name, ok := names[n.Payload]
		if !ok {
			name = "unknown payload " + n.Payload
		}
		if name == "fence" {
			break
		}
		heard = append(heard, name)
	}
	slices.Sort(heard)
	if want := []string{"b", "c"}; !slices.Equal(heard, want) {
		t.Fatalf("the batch announced %v; want %v", heard, want)
	}
}

// TestBatchManyOddValues: keys, tokens, fingerprints and bodies that an
// array's text form would have to quote or escape (quotes, backslashes,
// braces, commas, NULL, empty strings, multibyte characters, keys at the
// store's length limits), nil and empty requests and bodies, all in one
// batch of Reserves and then one of Completes, come back exactly.
func TestBatchManyOddValues(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	ctx := t.Context()
	keys := []idemstore.Key{
		{Scope: strings.Repeat("ü", idemstore.MaxScopeLength/2), Operation: strings.Repeat(`"\{},'`, 170) + "NULL", Key: strings.Repeat("€", idemstore.MaxKeyLength/3)},
		{Scope: "", Operation: "NULL", Key: "null"},
		{Scope: `{"a":[1,2]}`, Operation: `\\`, Key: `\x00'--`},
		{Scope: "tenant", Operation: " ", Key: "{}"},
		{Scope: "tenant", Operation: "a,b", Key: "日本語🙂"},
	}
	requests := []*idemstore.Request{
		nil,
		{},
		{Method: "PUT", Path: `/{"x"}`, Query: `a=\&b=NULL`, Body: []byte("\x00\xff\\\"{,}")},
		{Method: "POST", Body: []byte{}},
		nil,
	}
	responses := []*idemstore.Response{
		{Status: 200},
		{Status: 204, Header: http.Header{"X-Q": {`"{\}"`, ""}}},
		{Status: 201, Body: []byte("\x00\x01\xfe\xff")},
		{Status: 500, Body: []byte{}, NotReplayable: `too "big"`},
		{Status: 202, Body: []byte("NULL")},
	}
	token := func(i int) string { return fmt.Sprintf(`t"%d\{`, i) }
	var calls []func() batchtest.Result
	for i, k := range keys {
		calls = append(calls, func() batchtest.Result {
			rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: `fp'` + k.Key, Token: token(i), Lease: time.Minute, Request: requests[i]})
			return batchtest.Result{Record: rec, Created: created, Err: err}
		})
	}
	for i, r := range batchtest.InOneBatch(t, s.Batcher(), calls...) {
		if r.Err != nil || !r.Created {
			t.Fatalf("Reserve %d: %+v", i, r)
		}
	}
	for i, k := range keys {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.Key != k || rec.Token != token(i) || rec.Fingerprint != `fp'`+k.Key {
			t.Fatalf("record %d: %+v, %v", i, rec, err)
		}
		if want := requests[i]; (want == nil) != (rec.Request == nil) || want != nil &&
			(rec.Request.Method != want.Method || rec.Request.Path != want.Path || rec.Request.Query != want.Query || !bytes.Equal(rec.Request.Body, want.Body)) {
			t.Fatalf("request %d: %+v, want %+v", i, rec.Request, want)
		}
	}
	calls = calls[:0]
	for i, k := range keys {
		calls = append(calls, func() batchtest.Result {
			return batchtest.Result{Err: s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: token(i), Response: responses[i], Retention: time.Hour})}
		})
	}
	for i, r := range batchtest.InOneBatch(t, s.Batcher(), calls...) {
		if r.Err != nil {
			t.Fatalf("Complete %d: %v", i, r.Err)
		}
	}
	for i, k := range keys {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.State != idemstore.StateCompleted || rec.Response == nil {
			t.Fatalf("record %d: %+v, %v", i, rec, err)
		}
		got, want := rec.Response, responses[i]
		if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || got.NotReplayable != want.NotReplayable ||
			len(got.Header)+len(want.Header) > 0 && !reflect.DeepEqual(got.Header, want.Header) {
			t.Fatalf("response %d: %+v, want %+v", i, got, want)
		}
	}
}

// TestBatchManyLargeBodies: twenty Reserves with 1 MiB requests in one
// batch, then twenty Completes with 1 MiB answers in one batch; every body
// is its own caller's.
func TestBatchManyLargeBodies(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	largeBodies(t, s, 20, func(int) int { return 1 << 20 })
}

// TestBatchManyRoundCutBySize: a round whose bodies exceed what one
// statement may carry is cut into several statements (pgx refuses to send
// a message over 1 GiB, which a round of a large batch of large bodies
// can reach where each call alone fits). Every caller still gets its own
// outcome. The store's limit is lowered so that bodies of 64 to 192 KiB
// cut each round of twenty into statements of one to three calls.
func TestBatchManyRoundCutBySize(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	s.SetStatementBytes(300 << 10)
	largeBodies(t, s, 20, func(i int) int { return (i%3 + 1) << 16 })
}

// largeBodies reserves n keys in one batch, with requests of size(i)
// bytes, completes them in another, with answers of that size, and checks
// that each record holds its own bodies.
func largeBodies(t *testing.T, s *idempg.Store, n int, size func(int) int) {
	t.Helper()
	ctx := t.Context()
	body := func(i int, kind string) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("%s%02d", kind, i)), size(i)/(len(kind)+2))
	}
	key := func(i int) idemstore.Key { return batchtest.Key(fmt.Sprintf("big%02d", i)) }
	var calls []func() batchtest.Result
	for i := range n {
		calls = append(calls, func() batchtest.Result {
			_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key(i), Fingerprint: "fp", Token: key(i).Key, Lease: time.Minute,
				Request: &idemstore.Request{Method: "POST", Body: body(i, "req")}})
			return batchtest.Result{Created: created, Err: err}
		})
	}
	for i, r := range batchtest.InOneBatch(t, s.Batcher(), calls...) {
		if r.Err != nil || !r.Created {
			t.Fatalf("Reserve %d: %+v", i, r)
		}
	}
	calls = calls[:0]
	for i := range n {
		calls = append(calls, func() batchtest.Result {
			tok := key(i).Key
			if i%7 == 3 {
				tok = "stale" // a lost lease among the others
			}
			return batchtest.Result{Err: s.Complete(ctx, idemstore.CompleteParams{Key: key(i), Token: tok,
				Response: &idemstore.Response{Status: 200, Body: body(i, "resp")}, Retention: time.Hour})}
		})
	}
	for i, r := range batchtest.InOneBatch(t, s.Batcher(), calls...) {
		if lost := i%7 == 3; lost && !errors.Is(r.Err, idemstore.ErrLeaseLost) || !lost && r.Err != nil {
			t.Fatalf("Complete %d: %v", i, r.Err)
		}
	}
	if st := s.Batcher().Stats(); st.Batches != 2 || st.Batched != uint64(2*n) {
		t.Fatalf("Stats() = %+v; want two batches of %d", st, n)
	}
	for i := range n {
		rec, err := s.Get(ctx, key(i))
		if err != nil || rec.Request == nil || !bytes.Equal(rec.Request.Body, body(i, "req")) {
			t.Fatalf("%s: wrong or missing request (%v)", key(i).Key, err)
		}
		if i%7 == 3 {
			if rec.State != idemstore.StatePending {
				t.Fatalf("%s after a stale Complete: %s", key(i).Key, rec.State)
			}
		} else if rec.Response == nil || !bytes.Equal(rec.Response.Body, body(i, "resp")) {
			t.Fatalf("%s: wrong or missing answer", key(i).Key)
		}
	}
}

// TestBatchManyPoisonRunsAlone: a batch whose Completes hold a token the
// server refuses (a NUL byte) and whose Reserves hold a key it refuses
// (invalid UTF-8) fails as a whole; every member then runs alone, so the
// refused calls get the server's refusal and the others their own outcome,
// each Reserve created once.
func TestBatchManyPoisonRunsAlone(t *testing.T) {
	t.Parallel()
	s := newStore(t, testPool(t, ""), idempg.Config{})
	ctx := t.Context()
	held := batchtest.Key("held")
	if r := batchtest.Reserve(ctx, s, held, "h", time.Minute)(); r.Err != nil || !r.Created {
		t.Fatal(r)
	}
	got := batchtest.InOneBatch(t, s.Batcher(),
		batchtest.Reserve(ctx, s, batchtest.Key("a"), "a", time.Minute),
		batchtest.Reserve(ctx, s, batchtest.Key("bad\xff"), "b", time.Minute),
		batchtest.Complete(ctx, s, held, "h", time.Hour),
		batchtest.Complete(ctx, s, batchtest.Key("other"), "nul\x00", time.Hour),
		batchtest.Reserve(ctx, s, batchtest.Key("z"), "z", time.Minute),
	)
	for _, i := range []int{1, 3} {
		if err := got[i].Err; err == nil || got[i].Created || errors.Is(err, idemstore.ErrRetryable) ||
			errors.Is(err, idemstore.ErrUnavailable) || errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("refused call %d: %+v, want the server's refusal", i, got[i])
		}
	}
	for _, i := range []int{0, 4} {
		if got[i].Err != nil || !got[i].Created {
			t.Fatalf("Reserve %d beside the refused calls: %+v, want created", i, got[i])
		}
	}
	if got[2].Err != nil {
		t.Fatalf("Complete beside the refused calls: %v", got[2].Err)
	}
	if rec, err := s.Get(ctx, held); err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("held after the batch: %+v, %v", rec, err)
	}
}

// TestBatchManyConflictAfterSnapshot: a batch's Reserve waits for another
// transaction that inserted the same key, which then commits: the insert
// finds the conflict but the statement's snapshot, older than that commit,
// cannot read the record. The Reserve must not say created, and must come
// back with the other's record after its retry; the other Reserve of the
// batch is created. The same where the database's default isolation is
// REPEATABLE READ or SERIALIZABLE.
func TestBatchManyConflictAfterSnapshot(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run("default="+cmp.Or(isolation, "read committed"), func(t *testing.T) {
			t.Parallel()
			testConflictAfterSnapshot(t, testPool(t, isolation), idempg.Config{})
		})
	}
}

// TestReserveAloneConflictAfterSnapshot is TestBatchManyConflictAfterSnapshot
// for a Reserve without batching, one key.
func TestReserveAloneConflictAfterSnapshot(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run("default="+cmp.Or(isolation, "read committed"), func(t *testing.T) {
			t.Parallel()
			pool := testPool(t, isolation)
			s, schema := newStoreIn(t, pool, idempg.Config{DisableBatch: true})
			late := batchtest.Key("late")
			pid, end := holdInsert(t, pool, schema, late, "theirs")
			result := make(chan batchtest.Result, 1)
			go func() { result <- batchtest.Reserve(t.Context(), s, late, "mine", time.Minute)() }()
			blockedBy(t, pool, pid, nil)
			end(true)
			got := <-result
			wantRecord(t, "Reserve of a key committed meanwhile", got, late, idemstore.StatePending, "theirs")
		})
	}
}

func testConflictAfterSnapshot(t *testing.T, pool *pgxpool.Pool, cfg idempg.Config) {
	s, schema := newStoreIn(t, pool, cfg)
	ctx := t.Context()
	late := batchtest.Key("late")
	pid, end := holdInsert(t, pool, schema, late, "theirs")
	results := inOneBatchAsync(t, s,
		batchtest.Reserve(ctx, s, batchtest.Key("early"), "mine-early", time.Minute),
		batchtest.Reserve(ctx, s, late, "mine", time.Minute),
		batchtest.Reserve(ctx, s, batchtest.Key("zz"), "mine-zz", time.Minute),
	)
	blockedBy(t, pool, pid, nil)
	end(true)
	got := <-results
	for _, i := range []int{0, 2} {
		if got[i].Err != nil || !got[i].Created {
			t.Fatalf("Reserve %d of a free key: %+v", i, got[i])
		}
	}
	wantRecord(t, "Reserve of a key committed meanwhile", got[1], late, idemstore.StatePending, "theirs")
	if got[1].Record.Fingerprint != "fp-held" {
		t.Fatalf("Reserve of a key committed meanwhile: %+v", got[1].Record)
	}
}

// TestBatchManyBackendTerminated: the backend of a batch is terminated
// while the batch waits on a row lock. Nobody is told created or done,
// each gets ErrUnavailable, and nothing of the batch was committed.
func TestBatchManyBackendTerminated(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{})
	ctx := t.Context()
	held := batchtest.Key("held")
	if r := batchtest.Reserve(ctx, s, held, "h", time.Minute)(); r.Err != nil || !r.Created {
		t.Fatal(r)
	}
	blocked := batchtest.Key("m-blocked")
	pid, end := holdInsert(t, pool, schema, blocked, "theirs")
	results := inOneBatchAsync(t, s,
		batchtest.Reserve(ctx, s, batchtest.Key("a-new"), "a", time.Minute),
		batchtest.Complete(ctx, s, held, "h", time.Hour),
		batchtest.Reserve(ctx, s, blocked, "mine", time.Minute),
		batchtest.Reserve(ctx, s, batchtest.Key("z-new"), "z", time.Minute),
	)
	batchPid := blockedBy(t, pool, pid, nil)
	var terminated bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", batchPid).Scan(&terminated); err != nil || !terminated {
		t.Fatalf("pg_terminate_backend: %v, %v", terminated, err)
	}
	got := <-results
	end(false)
	for i, r := range got {
		if r.Created || !errors.Is(r.Err, idemstore.ErrUnavailable) {
			t.Fatalf("member %d of a terminated batch: %+v, want ErrUnavailable", i, r)
		}
	}
	for _, name := range []string{"a-new", "m-blocked", "z-new"} {
		if rec, err := s.Get(ctx, batchtest.Key(name)); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("%s after a terminated batch: %+v, %v; want none", name, rec, err)
		}
	}
	if rec, err := s.Get(ctx, held); err != nil || rec.State != idemstore.StatePending {
		t.Fatalf("held after a terminated batch: %+v, %v; want pending", rec, err)
	}
}

// TestBatchManyLockOrder: two stores (two processes) run one batch each
// on the same keys a < b < c < d. X holds c and releases it while
// reserving a and b; Y holds d and releases it while reserving b and c (a
// client's retry of c). A third transaction holds a, so X stops there. If
// X's release of c ran before its Reserves, Y would take b and wait for c,
// X would then wait for b: a deadlock, which the server breaks by failing
// one batch, whose Release reports ErrRetryable. The Reserves of a round,
// in key order, must come before its changes of existing records.
func TestBatchManyLockOrder(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	x, schema := newStoreIn(t, pool, idempg.Config{})
	y, err := idempg.New(pool, idempg.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = y.Close() })
	ctx := t.Context()
	a, b, c, d := batchtest.Key("a"), batchtest.Key("b"), batchtest.Key("c"), batchtest.Key("d")
	if r := batchtest.Reserve(ctx, x, c, "xc", time.Minute)(); r.Err != nil || !r.Created {
		t.Fatal(r)
	}
	if r := batchtest.Reserve(ctx, y, d, "yd", time.Minute)(); r.Err != nil || !r.Created {
		t.Fatal(r)
	}
	pid, end := holdInsert(t, pool, schema, a, "theirs")
	xResults := inOneBatchAsync(t, x,
		batchtest.Reserve(ctx, x, a, "xa", time.Minute),
		batchtest.Reserve(ctx, x, b, "xb", time.Minute),
		batchtest.Call(func() error { return x.Release(ctx, idemstore.ReleaseParams{Key: c, Token: "xc"}) }),
	)
	xPid := blockedBy(t, pool, pid, nil)
	yDone := make(chan struct{})
	yResults := make(chan []batchtest.Result, 1)
	go func() {
		defer close(yDone)
		yResults <- batchtest.InOneBatch(t, y.Batcher(),
			batchtest.Reserve(ctx, y, b, "yb", time.Minute),
			batchtest.Reserve(ctx, y, c, "yc", time.Minute),
			batchtest.Call(func() error { return y.Release(ctx, idemstore.ReleaseParams{Key: d, Token: "yd"}) }),
		)
	}()
	blockedBy(t, pool, xPid, yDone) // Y waits for X, or is done
	end(false)
	gx, gy := <-xResults, <-yResults
	if gx[2].Err != nil || gy[2].Err != nil {
		t.Fatalf("Releases: X %v, Y %v; want both done (a deadlock between the batches?)", gx[2].Err, gy[2].Err)
	}
	if gx[0].Err != nil || !gx[0].Created {
		t.Fatalf("X's Reserve of a: %+v", gx[0])
	}
	if gx[1].Err != nil || gy[0].Err != nil || gx[1].Created == gy[0].Created {
		t.Fatalf("Reserves of b: X %+v, Y %+v; want one created", gx[1], gy[0])
	}
	if gy[1].Err != nil || (!gy[1].Created && gy[1].Record == nil) {
		t.Fatalf("Y's Reserve of c: %+v", gy[1])
	}
}

// TestBatchManyPlansUseIndexes: with 50,000 records, the generic plans of
// reserveMany and completeMany (which a prepared statement ends up with)
// find records by index, never by scanning the table.
func TestBatchManyPlansUseIndexes(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	s, schema := newStoreIn(t, pool, idempg.Config{})
	ctx := t.Context()
	table := pgx.Identifier{schema, "idem_records"}.Sanitize()
	if _, err := pool.Exec(ctx, "INSERT INTO "+table+` (scope, operation, key, fingerprint, state, token, lease_until, created_at)
SELECT 'tenant', 'POST /charges', 'k' || g, 'fp', CASE WHEN g % 2 = 0 THEN 'pending' ELSE 'completed' END, 't' || g,
    now() + interval '1 minute', now() FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+table); err != nil {
		t.Fatal(err)
	}
	reserveMany, completeMany, perRow := s.BatchSQL()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct{ name, sql, args string }{
		{"reserveMany", reserveMany, `'{tenant,tenant}', '{POST /charges,POST /charges}', '{k2,new}', '{fp,fp}', '{t,u}', '{1 minute,1 minute}', '{NULL,NULL}', '{"",acct}', '{"",acct}', '{8192,0}'`},
		{"completeMany", completeMany, `'{tenant,tenant}', '{POST /charges,POST /charges}', '{k2,k4}', '{t2,t4}', '{NULL,NULL}', '{1 hour,1 hour}', 'idem', '{p,q}'`},
		{"completeMany per row", perRow, `'{tenant,tenant}', '{POST /charges,POST /charges}', '{k2,k4}', '{t2,t4}', '{NULL,NULL}', '{1 hour,1 hour}', 'idem', '{p,q}'`},
	} {
		name := "idem_attack_" + strings.ReplaceAll(q.name, " ", "_") + "_" + randomHex(4)
		if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+q.sql); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN EXECUTE "+name+"("+q.args+")")
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "DEALLOCATE "+name); err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan on idem_records") || !strings.Contains(plan, "Index Scan using idem_records_") {
			t.Fatalf("generic plan of %s reads idem_records without an index:\n%s", q.name, plan)
		}
	}
}

// TestBatchManyWaiterSubscribedWhileCompleting: a waiter subscribes to b
// after the batch's completeMany took its snapshot but before it locked b's
// row. The statement must still see the waiter, as idem_awaited's and
// idem_wake's fresh snapshots do, and announce b; its own snapshot would
// miss the waiter. The schema has migration 006: the statement checks for
// waiters once, after its update. The same holds where the database's
// default isolation is REPEATABLE READ or SERIALIZABLE, under which every
// statement of a transaction reads one snapshot: a batch is READ
// COMMITTED whatever the default.
func TestBatchManyWaiterSubscribedWhileCompleting(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run("default="+cmp.Or(isolation, "read committed"), func(t *testing.T) {
			t.Parallel()
			testWaiterSubscribedWhileCompleting(t, testPool(t, isolation))
		})
	}
}

func testWaiterSubscribedWhileCompleting(t *testing.T, pool *pgxpool.Pool) {
	s, schema := newStoreIn(t, pool, idempg.Config{})
	ctx := t.Context()
	a, b, c := reserveKey(t, s, "a"), reserveKey(t, s, "b"), reserveKey(t, s, "c")
	pid, release := shareLock(t, pool, schema, b)
	results := inOneBatchAsync(t, s,
		batchtest.Complete(ctx, s, a, "tok-a", time.Hour),
		batchtest.Complete(ctx, s, b, "tok-b", time.Hour),
		batchtest.Complete(ctx, s, c, "tok-c", time.Hour),
	)
	waitBlockedBy(t, pool, pid) // the batch has its snapshot and waits for b's row
	woken := subscribe(t, s, b)
	select {
	case <-woken:
		t.Fatal("woken before the record changed")
	default:
	}
	release()
	for i, r := range <-results {
		if r.Err != nil {
			t.Fatalf("Complete %d: %v", i, r.Err)
		}
	}
	waitWake(t, woken, "the waiter that subscribed while the batch waited for the row")
	if !s.ChecksWaitersOnce() {
		t.Fatal("the store checked for waiters per record on a schema with migration 006")
	}
}
