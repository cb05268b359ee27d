package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-dev/idem/idemstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a fake store: Single and Batch record what they ran and give
// each op the outcome "ok:<token>".
type recorder struct {
	mu      sync.Mutex
	singles []string // tokens run alone
	batches [][]string
	// batch, when set, runs instead of the default (which records).
	batch func(ctx context.Context, ops []*Op) error
}

func (r *recorder) config() Config {
	return Config{
		Single: func(ctx context.Context, op *Op) {
			r.mu.Lock()
			r.singles = append(r.singles, op.Token)
			r.mu.Unlock()
			op.Err = ctx.Err()
			op.Reason = "single:" + op.Token
		},
		Batch: func(ctx context.Context, ops []*Op) error {
			if r.batch != nil {
				return r.batch(ctx, ops)
			}
			var toks []string
			for _, op := range ops {
				toks = append(toks, op.Token)
				op.Reason = "batch:" + op.Token
			}
			r.mu.Lock()
			r.batches = append(r.batches, toks)
			r.mu.Unlock()
			return nil
		},
	}
}

func key(k string) idemstore.Key { return idemstore.Key{Scope: "s", Operation: "op", Key: k} }

// doAll starts one Do per op, in order (each queued before the next
// starts), on a paused batcher, then resumes it and waits for them.
func doAll(t *testing.T, b *Batcher, ctxs []context.Context, ops []*Op) []error {
	t.Helper()
	p := b.Pause()
	errs := make([]error, len(ops))
	var wg sync.WaitGroup
	for i, op := range ops {
		ctx := t.Context()
		if ctxs != nil && ctxs[i] != nil {
			ctx = ctxs[i]
		}
		wg.Go(func() { errs[i] = b.Do(ctx, op) })
		p.Wait(i + 1)
	}
	p.Resume()
	wg.Wait()
	return errs
}

func TestLoneCallRunsAloneInTheCallersContext(t *testing.T) {
	r := &recorder{}
	type ctxKey struct{}
	ctx := context.WithValue(t.Context(), ctxKey{}, "caller")
	var seen any
	cfg := r.config()
	single := cfg.Single
	cfg.Single = func(c context.Context, op *Op) { seen = c.Value(ctxKey{}); single(c, op) }
	b := New(cfg)
	op := &Op{Kind: Reserve, Key: key("a"), Token: "t1"}
	if err := b.Do(ctx, op); err != nil {
		t.Fatal(err)
	}
	if seen != "caller" || op.Reason != "single:t1" {
		t.Fatalf("lone call: context value %v, outcome %q; want the caller's context and Single", seen, op.Reason)
	}
	if st := b.Stats(); st.Batches != 0 || st.Alone != 1 || len(r.batches) != 0 {
		t.Fatalf("a lone call: Stats() = %+v, %d batches run; want none, and one call alone", st, len(r.batches))
	}
}

func TestQueuedCallsRunAsOneBatchInKeyOrder(t *testing.T) {
	r := &recorder{}
	b := New(r.config())
	ops := []*Op{
		{Kind: Complete, Key: key("c"), Token: "c1"},
		{Kind: Reserve, Key: key("a"), Token: "a1"},
		{Kind: Reserve, Key: key("c"), Token: "c2"},
		{Kind: Release, Key: key("b"), Token: "b1"},
		{Kind: Reserve, Key: key("a"), Token: "a2"},
	}
	for i, err := range doAll(t, b, nil, ops) {
		if err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
	}
	want := [][]string{{"a1", "a2", "b1", "c1", "c2"}}
	if !slices.EqualFunc(r.batches, want, slices.Equal) {
		t.Fatalf("batches %v, want %v (sorted by key, same key in arrival order)", r.batches, want)
	}
	for _, op := range ops {
		if op.Reason != "batch:"+op.Token {
			t.Fatalf("op %s: outcome %q, want the batch's", op.Token, op.Reason)
		}
	}
	if st := b.Stats(); st.Batches != 1 || st.Batched != 5 {
		t.Fatalf("Stats() = %+v; want 1 batch of 5 calls", st)
	}
}

func TestCallCancelledWhileQueuedIsNotRun(t *testing.T) {
	r := &recorder{}
	b := New(r.config())
	p := b.Pause()
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error)
	go func() { gone <- b.Do(ctx, &Op{Kind: Reserve, Key: key("a"), Token: "left"}) }()
	p.Wait(1)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do after its context ended while queued: %v, want context.Canceled", err)
	}
	var wg sync.WaitGroup
	for _, tok := range []string{"x", "y"} {
		wg.Go(func() {
			if err := b.Do(t.Context(), &Op{Kind: Reserve, Key: key(tok), Token: tok}); err != nil {
				t.Error(err)
			}
		})
	}
	p.Wait(3)
	p.Resume()
	wg.Wait()
	if len(r.singles) != 0 || !slices.EqualFunc(r.batches, [][]string{{"x", "y"}}, slices.Equal) {
		t.Fatalf("ran singles %v, batches %v; want only x and y, in one batch", r.singles, r.batches)
	}
}

func TestAlreadyCancelledCallIsRefusedBeforeQueueing(t *testing.T) {
	r := &recorder{}
	b := New(r.config())
	p := b.Pause()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := b.Do(ctx, &Op{Kind: Reserve, Key: key("a"), Token: "t"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with a cancelled context on a busy shard: %v", err)
	}
	p.Resume()
	if len(r.singles)+len(r.batches) != 0 {
		t.Fatalf("ran %v %v", r.singles, r.batches)
	}
}

// TestMemberLeavingDoesNotCancelTheBatch: a member whose context ends while
// its batch runs gets its context's error at once; the batch's context
// stays alive while another member waits, and ends once all have left.
func TestMemberLeavingDoesNotCancelTheBatch(t *testing.T) {
	r := &recorder{}
	started, release := make(chan struct{}), make(chan struct{})
	var batchCtx context.Context
	r.batch = func(ctx context.Context, ops []*Op) error {
		batchCtx = ctx
		close(started)
		<-release
		for _, op := range ops {
			op.Reason = "batch:" + op.Token
		}
		return nil
	}
	b := New(r.config())
	p := b.Pause()
	ctxA, cancelA := context.WithCancel(t.Context())
	ctxB, cancelB := context.WithCancel(t.Context())
	defer cancelB()
	errA, errB := make(chan error), make(chan error)
	opB := &Op{Kind: Complete, Key: key("b"), Token: "b"}
	go func() { errA <- b.Do(ctxA, &Op{Kind: Reserve, Key: key("a"), Token: "a"}) }()
	p.Wait(1)
	go func() { errB <- b.Do(ctxB, opB) }()
	p.Wait(2)
	p.Resume()
	<-started
	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("member that left: %v, want context.Canceled", err)
	}
	if batchCtx.Err() != nil {
		t.Fatal("the batch's context ended while a member still waits")
	}
	close(release)
	if err := <-errB; err != nil || opB.Reason != "batch:b" {
		t.Fatalf("member that stayed: %v, outcome %q", err, opB.Reason)
	}

	// All members leave: the batch's context ends.
	r2 := &recorder{}
	started2, ended := make(chan struct{}), make(chan struct{})
	r2.batch = func(ctx context.Context, ops []*Op) error {
		close(started2)
		<-ctx.Done()
		close(ended)
		return ctx.Err()
	}
	b2 := New(r2.config())
	p2 := b2.Pause()
	ctxs := make([]context.Context, 2)
	cancels := make([]context.CancelFunc, 2)
	errs := make(chan error, 2)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(t.Context())
		go func() {
			op := &Op{Kind: Reserve, Key: key(fmt.Sprint(i)), Token: fmt.Sprint(i)}
			err := b2.Do(ctxs[i], op)
			if err == nil { // the batch ended before the member saw its context end
				err = op.Err
			}
			errs <- err
		}()
		p2.Wait(i + 1)
	}
	p2.Resume()
	<-started2
	for _, c := range cancels {
		c()
	}
	<-ended
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("member: %v", err)
		}
	}
}

func TestBatchErrorFailsEveryMember(t *testing.T) {
	r := &recorder{}
	boom := fmt.Errorf("%w: commit refused", idemstore.ErrRetryable)
	r.batch = func(ctx context.Context, ops []*Op) error {
		for _, op := range ops {
			op.Created = true // written before the failure: must not survive it
		}
		return boom
	}
	b := New(r.config())
	ops := []*Op{{Kind: Reserve, Key: key("a"), Token: "a"}, {Kind: Reserve, Key: key("b"), Token: "b"}}
	for i, err := range doAll(t, b, nil, ops) {
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(ops[i].Err, boom) || ops[i].Created {
			t.Fatalf("op %d: Err %v, Created %v; want the batch's error and nothing created", i, ops[i].Err, ops[i].Created)
		}
	}
}

func TestAloneRerunsEveryMemberWithItsOwnContext(t *testing.T) {
	r := &recorder{}
	r.batch = func(ctx context.Context, ops []*Op) error { return Alone(errors.New("value refused")) }
	b := New(r.config())
	cancelled, cancel := context.WithCancel(t.Context())
	ops := []*Op{{Kind: Reserve, Key: key("a"), Token: "a"}, {Kind: Complete, Key: key("b"), Token: "b"}}
	ctxs := []context.Context{nil, cancelled}
	p := b.Pause()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, op := range ops {
		ctx := t.Context()
		if ctxs[i] != nil {
			ctx = ctxs[i]
		}
		wg.Go(func() { errs[i] = b.Do(ctx, op) })
		p.Wait(i + 1)
	}
	// b's context ends after its call was queued, but before the batch:
	// take drops it.
	cancel()
	p.Resume()
	wg.Wait()
	if errs[0] != nil || ops[0].Reason != "single:a" || ops[0].Err != nil {
		t.Fatalf("member a: %v, outcome %q, %v; want it rerun alone", errs[0], ops[0].Reason, ops[0].Err)
	}
	if !errors.Is(errs[1], context.Canceled) {
		t.Fatalf("member b: %v", errs[1])
	}
	slices.Sort(r.singles)
	if !slices.Equal(r.singles, []string{"a"}) {
		t.Fatalf("singles %v, want [a]", r.singles)
	}
}

func TestAloneIsRecognisedThroughWrapping(t *testing.T) {
	base := errors.New("refused")
	err := fmt.Errorf("ctx: %w", Alone(base))
	if !IsAlone(err) || !errors.Is(err, base) || IsAlone(base) {
		t.Fatalf("IsAlone(%v) = %v, errors.Is base = %v", err, IsAlone(err), errors.Is(err, base))
	}
}

func TestBatchPanicFailsItsMembersAndTheBatcherGoesOn(t *testing.T) {
	r := &recorder{}
	r.batch = func(ctx context.Context, ops []*Op) error { panic("bug") }
	b := New(r.config())
	ops := []*Op{{Kind: Reserve, Key: key("a"), Token: "a"}, {Kind: Reserve, Key: key("b"), Token: "b"}}
	doAll(t, b, nil, ops)
	for _, op := range ops {
		if op.Err == nil {
			t.Fatalf("op %s: no error after the batch panicked", op.Token)
		}
	}
	after := &Op{Kind: Reserve, Key: key("c"), Token: "c"}
	if err := b.Do(t.Context(), after); err != nil || after.Reason != "single:c" {
		t.Fatalf("call after the panic: %v, %q", err, after.Reason)
	}
}

func TestSinglePanicReachesTheCallerAndFreesTheShard(t *testing.T) {
	cfg := (&recorder{}).config()
	single := cfg.Single
	cfg.Single = func(ctx context.Context, op *Op) {
		if op.Token == "bad" {
			panic("bug")
		}
		single(ctx, op)
	}
	b := New(cfg)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		_ = b.Do(t.Context(), &Op{Kind: Reserve, Key: key("a"), Token: "bad"})
	}()
	op := &Op{Kind: Reserve, Key: key("a"), Token: "good"}
	if err := b.Do(t.Context(), op); err != nil || op.Reason != "single:good" {
		t.Fatalf("call after the panic: %v, %q", err, op.Reason)
	}
}

// TestShardsKeepOneKeysCallsTogether: with several shards, the calls of one
// key always meet in one queue, so they run in order, one batch after
// another.
func TestShardsKeepOneKeysCallsTogether(t *testing.T) {
	r := &recorder{}
	cfg := r.config()
	cfg.Shards = 4
	b := New(cfg)
	seen := map[*shard]bool{}
	for i := range 64 {
		k := key(fmt.Sprint(i))
		sh := b.shard(&Op{Key: k})
		if b.shard(&Op{Key: k}) != sh {
			t.Fatalf("key %v maps to two shards", k)
		}
		seen[sh] = true
	}
	if len(seen) < 2 {
		t.Fatalf("64 keys all went to %d shard(s)", len(seen))
	}
	ops := []*Op{{Kind: Reserve, Key: key("k"), Token: "1"}, {Kind: Release, Key: key("k"), Token: "2"}, {Kind: Reserve, Key: key("k"), Token: "3"}}
	doAll(t, b, nil, ops)
	if !slices.EqualFunc(r.batches, [][]string{{"1", "2", "3"}}, slices.Equal) {
		t.Fatalf("batches %v, want the three calls of one key in one batch, in order", r.batches)
	}
}

// TestConcurrentCallsAllComplete runs many calls from many goroutines
// through the batcher, under -race: each runs exactly once and gets its
// outcome.
func TestConcurrentCallsAllComplete(t *testing.T) {
	r := &recorder{}
	b := New(r.config())
	const n = 200
	var wg sync.WaitGroup
	ops := make([]*Op, n)
	for i := range n {
		ops[i] = &Op{Kind: Reserve, Key: key(fmt.Sprint(i % 7)), Token: fmt.Sprint(i)}
		wg.Go(func() {
			if err := b.Do(t.Context(), ops[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, op := range ops {
		if op.Reason != "single:"+op.Token && op.Reason != "batch:"+op.Token {
			t.Fatalf("op %s: no outcome (%q)", op.Token, op.Reason)
		}
	}
	ran := len(r.singles)
	for _, batch := range r.batches {
		ran += len(batch)
	}
	if ran != n {
		t.Fatalf("%d calls ran, want each of the %d exactly once", ran, n)
	}
}

func TestRounds(t *testing.T) {
	ops := []*Op{
		{Key: key("a"), Token: "a1"}, {Key: key("a"), Token: "a2"},
		{Key: key("b"), Token: "b1"},
		{Key: key("c"), Token: "c1"}, {Key: key("c"), Token: "c2"}, {Key: key("c"), Token: "c3"},
	}
	var got [][]string
	for _, round := range Rounds(ops) {
		var toks []string
		for _, op := range round {
			toks = append(toks, op.Token)
		}
		got = append(got, toks)
	}
	want := [][]string{{"a1", "b1", "c1"}, {"a2", "c2"}, {"c3"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("Rounds = %v, want %v", got, want)
	}
	if r := Rounds(nil); len(r) != 0 {
		t.Fatalf("Rounds(nil) = %v", r)
	}
}

// TestLeftCallKeepsItsInputs: a caller whose context ends while its call's
// batch runs leaves, and may reuse the memory of the request and answer it
// passed; the batch still reads them as they were when the call was made.
func TestLeftCallKeepsItsInputs(t *testing.T) {
	r := &recorder{}
	started, release := make(chan struct{}), make(chan struct{})
	seen := make(chan string, 2)
	r.batch = func(ctx context.Context, ops []*Op) error {
		close(started)
		<-release
		for _, op := range ops {
			switch op.Kind {
			case Reserve:
				seen <- string(op.Request.Body)
			case Complete:
				seen <- op.Response.Header.Get("X-A") + " " + string(op.Response.Body)
			}
		}
		return nil
	}
	b := New(r.config())
	p := b.Pause()
	req := &idemstore.Request{Method: "POST", Path: "/pay", Body: []byte("first-request")}
	resp := &idemstore.Response{Status: 201, Header: http.Header{"X-A": {"first"}}, Body: []byte("first-answer")}
	ctx, cancel := context.WithCancel(t.Context())
	errs := make(chan error, 2)
	go func() { errs <- b.Do(ctx, &Op{Kind: Reserve, Key: key("a"), Token: "a", Request: req}) }()
	p.Wait(1)
	go func() { errs <- b.Do(ctx, &Op{Kind: Complete, Key: key("b"), Token: "b", Response: resp}) }()
	p.Wait(2)
	p.Resume()
	<-started
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("a caller that left: %v", err)
		}
	}
	// The callers reuse what they passed, as the middleware's pool does.
	copy(req.Body, "other-request")
	copy(resp.Body, "other-answer")
	clear(resp.Header)
	close(release)
	got := []string{<-seen, <-seen}
	if want := []string{"first-request", "first first-answer"}; !slices.Equal(got, want) {
		t.Fatalf("the batch read %q, want %q", got, want)
	}
}

// TestChunks cuts runs by count and by size, never leaves a call out or
// alone in a run of its own unless it has to, and keeps order.
func TestChunks(t *testing.T) {
	ops := make([]*Op, 7)
	sizes := make(map[*Op]int, len(ops))
	for i, n := range []int{3, 3, 3, 10, 1, 1, 1} {
		ops[i] = &Op{Key: key(string(rune('a' + i)))}
		sizes[ops[i]] = n
	}
	size := func(op *Op) int { return sizes[op] }
	lens := func(runs [][]*Op) (out []int) {
		var flat []*Op
		for _, r := range runs {
			out = append(out, len(r))
			flat = append(flat, r...)
		}
		if !slices.Equal(flat, ops) {
			t.Fatalf("runs %v do not hold every call in order", out)
		}
		return out
	}
	for _, tc := range []struct {
		name             string
		maxOps, maxBytes int
		size             func(*Op) int
		want             []int
	}{
		{"by count", 3, 1 << 20, size, []int{3, 3, 1}},
		{"by count, no sizes", 2, 0, nil, []int{2, 2, 2, 1}},
		{"by size", 0, 6, size, []int{2, 1, 1, 3}}, // the 10-byte call alone, over the bound
		{"by both", 2, 6, size, []int{2, 1, 1, 2, 1}},
		{"unbounded", 0, 1 << 20, size, []int{7}},
	} {
		if got := lens(Chunks(ops, tc.maxOps, tc.maxBytes, tc.size)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: run lengths %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := Chunks(nil, 3, 10, size); len(got) != 0 {
		t.Errorf("Chunks(nil) = %v", got)
	}
}
