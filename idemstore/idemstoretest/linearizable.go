package idemstoretest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idem-dev/idem/idemstore"
)

// The Linearizable area's workload: a few goroutines per key make random
// calls (every call of the record's state machine, see model.go) on a few
// keys at once, some of them through injected faults, and the recorded
// history must be linearizable with respect to the model of one record.
//
// Many short histories rather than a few long ones: the checker's work
// grows steeply with the length of one key's history (and with its calls of
// unknown outcome), while each key is one more chance to catch a bug.
const (
	linKeys         = 12 // records
	linWorkers      = 4  // goroutines per record
	linCallsPerWork = 20 // calls per goroutine
	// linCheckBound bounds the check of one key's history, which is
	// NP-hard in the worst case; a linearizable history this small takes
	// milliseconds, one that is not up to a few seconds. It is not a
	// timing assertion: a check that gives up fails.
	linCheckBound = 2 * time.Minute
)

// testLinearizable records a concurrent history of every store call on a
// few records, under faults, and checks it with porcupine against the model
// of one record.
func testLinearizable(t *testing.T, h Harness) {
	f := newFixture(t, h.New(t))
	// The seed draws the calls; how they interleave is the scheduler's
	// and the store's.
	seed := rand.Uint64()
	w := &linWorkload{f: f, store: flakyStore{f.s}, seed: seed}
	start := time.Now()
	history := w.run()
	ran := time.Since(start)
	if len(w.unexpected) > 0 {
		t.Errorf("seed %d: %d calls without an injected fault failed with an error the contract does not name, first: %v", seed, len(w.unexpected), w.unexpected[0])
	}

	// Each key's history is checked alone (porcupine would check them
	// all to the end before reporting one that fails), and the first that
	// fails is shown.
	model := recordModel()
	start = time.Now()
	for _, part := range partitionByKey(history) {
		key := part[0].Input.(linInput).key
		res, info := porcupine.CheckOperationsVerbose(model, part, linCheckBound)
		if res == porcupine.Ok {
			continue
		}
		path := filepath.Join(t.ArtifactDir(), "linearizable-"+key+".html")
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Errorf("writing the visualization: %v", err)
		}
		if res == porcupine.Unknown {
			t.Fatalf("seed %d: porcupine could not tell within %v whether the history of key %q (%d calls) is linearizable; a history that is not often takes longest.\n"+
				"Visualization: %s (go test -artifacts keeps it)\n%s",
				seed, linCheckBound, key, len(part), path, explainIllegal(model, part, info))
		}
		t.Fatalf("seed %d: the history of key %q (%d calls) is not linearizable with respect to the record's state machine.\n"+
			"Visualization: %s (go test -artifacts keeps it)\n%s",
			seed, key, len(part), path, explainIllegal(model, part, info))
	}
	t.Logf("seed %d: %d calls (%d failed, outcome unknown; %d refused as retryable) on %d keys: linearizable (ran %v, checked %v); changes made: %s",
		seed, len(history), w.unknown.Load(), w.retryable.Load(), linKeys, ran.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), changesMade(history))
}

// changesMade counts the calls that changed a record, by kind.
func changesMade(history []porcupine.Operation) string {
	counts := make(map[opKind]int)
	for _, op := range history {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if out.result == resCreated || out.result == resOK && in.kind != opGet {
			counts[in.kind]++
		}
	}
	var parts []string
	for kind := opReserve; kind <= opDelete; kind++ {
		if n := counts[kind]; n > 0 {
			parts = append(parts, fmt.Sprintf("%v %d", kind, n))
		}
	}
	return strings.Join(parts, ", ")
}

// linWorkload runs the calls and records the history.
type linWorkload struct {
	f     *fixture
	store idemstore.Store
	seed  uint64

	clock   atomic.Int64 // porcupine's timestamps: every call and return takes the next tick
	clients atomic.Int64 // porcupine's client ids
	names   atomic.Int64 // fresh tokens, reasons and bodies

	mu         sync.Mutex
	history    []porcupine.Operation
	pending    []int // indexes in history of calls whose outcome is unknown
	unexpected []error

	unknown, retryable atomic.Int64
}

// run makes the calls and returns the history. Calls whose outcome is
// unknown return, as far as porcupine knows, after every other call: a
// write whose reply was lost may land at any later moment.
func (w *linWorkload) run() []porcupine.Operation {
	var wg sync.WaitGroup
	start := make(chan struct{})
	keys := make([]idemstore.Key, linKeys)
	for i := range keys {
		keys[i] = w.f.key(fmt.Sprintf("lin%d", i))
		view := &keyView{}
		for j := range linWorkers {
			r := rand.New(rand.NewPCG(w.seed, uint64(i*linWorkers+j)))
			wg.Go(func() {
				<-start
				w.work(r, keys[i], view)
			})
		}
	}
	close(start)
	wg.Wait()
	// A last read of every record, once all is quiet.
	for _, k := range keys {
		w.call(noFault, w.newClient(), linInput{key: k.Key, kind: opGet}, nil)
	}
	end := w.clock.Add(1)
	for _, i := range w.pending {
		w.history[i].Return = end
	}
	return w.history
}

func (w *linWorkload) newClient() int { return int(w.clients.Add(1) - 1) }

func (w *linWorkload) name(prefix string) string {
	return fmt.Sprintf("%s%d", prefix, w.names.Add(1))
}

// work is one goroutine's calls on k.
func (w *linWorkload) work(r *rand.Rand, k idemstore.Key, view *keyView) {
	client := w.newClient()
	for range linCallsPerWork {
		in := w.nextCall(r, k, view)
		if !w.call(pickFault(r), client, in, view) {
			// The call may still take effect after this goroutine
			// moved on: porcupine wants each client's calls one
			// after another, so the next ones are another client's.
			client = w.newClient()
		}
	}
}

// linWeights are the odds of each call, by the state a record was last
// seen in (a worker is more likely to reserve a key it saw free, to settle
// a lease it saw pending, to resolve a record it saw in review), so that
// each record goes round its states many times; every call stays possible
// in every state, for the stale views that concurrent workers have.
var linWeights = map[idemstore.State][]struct {
	kind   opKind
	weight int
}{
	"": {
		{opReserve, 40}, {opGet, 10}, {opComplete, 5}, {opRelease, 5}, {opEscalate, 5},
		{opExtend, 5}, {opTakeover, 5}, {opResolve, 5}, {opDelete, 5},
	},
	idemstore.StatePending: {
		{opReserve, 8}, {opGet, 8}, {opComplete, 14}, {opRelease, 12}, {opEscalate, 12},
		{opExtend, 14}, {opTakeover, 16}, {opResolve, 4}, {opDelete, 4},
	},
	idemstore.StateCompleted: {
		{opReserve, 10}, {opGet, 8}, {opComplete, 8}, {opRelease, 12}, {opEscalate, 6},
		{opExtend, 12}, {opTakeover, 6}, {opResolve, 4}, {opDelete, 16},
	},
	idemstore.StateNeedsReview: {
		{opReserve, 10}, {opGet, 8}, {opComplete, 6}, {opRelease, 6}, {opEscalate, 6},
		{opExtend, 6}, {opTakeover, 6}, {opResolve, 30}, {opDelete, 6},
	},
}

// nextCall draws a random call on k.
func (w *linWorkload) nextCall(r *rand.Rand, k idemstore.Key, view *keyView) linInput {
	weights := linWeights[view.state()]
	total := 0
	for _, c := range weights {
		total += c.weight
	}
	n := r.IntN(total)
	in := linInput{key: k.Key}
	for _, c := range weights {
		if n < c.weight {
			in.kind = c.kind
			break
		}
		n -= c.weight
	}
	// Half the leases granted are expired at once, half live for an
	// hour: see the model for why.
	lease := leaseLive
	if r.IntN(2) == 0 {
		lease = leaseExpired
	}
	switch in.kind {
	case opReserve:
		in.token, in.fingerprint, in.lease = w.name("t"), []string{"fp-a", "fp-b"}[r.IntN(2)], lease
	case opComplete:
		in.token, in.response = view.pick(r, w), w.name("201 body")
	case opRelease:
		in.token, in.ifExpired = view.pick(r, w), r.IntN(2) == 0
	case opEscalate:
		in.token, in.ifExpired, in.reason = view.pick(r, w), r.IntN(2) == 0, w.name("escalated")
	case opExtend:
		in.token, in.lease = view.pick(r, w), lease
	case opTakeover:
		in.token, in.newToken, in.lease = view.pick(r, w), w.name("t"), lease
	case opResolve:
		if r.IntN(4) != 0 {
			in.token = view.pick(r, w)
		}
		in.release = r.IntN(3) == 0
		if !in.release {
			in.response = w.name("200 resolved")
		}
		if r.IntN(2) == 0 {
			in.reason = w.name("resolved")
		}
	case opDelete:
		if r.IntN(4) != 0 {
			in.token = view.pick(r, w)
		}
	}
	return in
}

// call makes the call in through fault, records it, and reports whether
// its outcome is known.
func (w *linWorkload) call(fault fault, client int, in linInput, view *keyView) bool {
	ctx := withFault(w.f.ctx(), fault)
	k := w.f.key(in.key)
	call := w.clock.Add(1)
	var (
		out linOutput
		rec *idemstore.Record
		err error
	)
	switch in.kind {
	case opReserve:
		var created bool
		rec, created, err = w.store.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: in.fingerprint, Token: in.token, Lease: in.lease})
		switch {
		case err == nil && created:
			out.result = resCreated
		case err == nil && rec != nil:
			out.result, out.record = resExists, observe(rec)
		case err == nil:
			err = errors.New("Reserve returned no record and created = false")
		}
	case opGet:
		rec, err = w.store.Get(ctx, k)
		if err == nil {
			out.result, out.record = resOK, observe(rec)
		}
	case opComplete:
		err = w.store.Complete(ctx, idemstore.CompleteParams{Key: k, Token: in.token, Response: linResponse(in.response), Retention: retainLive})
	case opRelease:
		err = w.store.Release(ctx, idemstore.ReleaseParams{Key: k, Token: in.token, IfExpired: in.ifExpired})
	case opEscalate:
		err = w.store.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: in.token, Reason: in.reason, IfExpired: in.ifExpired})
	case opExtend:
		err = w.store.Extend(ctx, idemstore.ExtendParams{Key: k, Token: in.token, Lease: in.lease})
	case opTakeover:
		err = w.store.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: in.token, NewToken: in.newToken, Lease: in.lease})
	case opResolve:
		p := idemstore.ResolveParams{Key: k, Action: idemstore.ResolveComplete, Token: in.token, Reason: in.reason, Retention: retainLive}
		if in.release {
			p.Action = idemstore.ResolveRelease
		} else {
			p.Response = linResponse(in.response)
		}
		err = w.store.Resolve(ctx, p)
	case opDelete:
		err = w.store.Delete(ctx, idemstore.DeleteParams{Key: k, Token: in.token})
	}
	ret := w.clock.Add(1)

	if err == nil && out.result == 0 {
		out.result = resOK
	} else if err != nil {
		out.result = sentinelResult(in.kind, err)
	}
	op := porcupine.Operation{ClientId: client, Input: in, Call: call, Return: ret}
	known := true
	switch {
	case out.result != 0:
	case errors.Is(err, idemstore.ErrRetryable):
		// The store says nothing changed: the call is left out, so
		// a change it made after all would show as one nobody made.
		w.retryable.Add(1)
		return true
	case in.kind == opGet:
		return true // a failed read tells nothing
	default:
		out.unknown, known = true, false
		w.unknown.Add(1)
		if fault == noFault && !errors.Is(err, idemstore.ErrUnavailable) {
			w.mu.Lock()
			w.unexpected = append(w.unexpected, fmt.Errorf("%v: %w", in, err))
			w.mu.Unlock()
		}
	}
	op.Output = out
	if fault != noFault || out.unknown {
		op.Metadata = fmt.Sprintf("fault: %v; error: %v", fault, err)
	}

	if view != nil {
		view.learn(in, out)
	}

	w.mu.Lock()
	if out.unknown {
		w.pending = append(w.pending, len(w.history))
	}
	w.history = append(w.history, op)
	w.mu.Unlock()
	return known
}

// sentinelResult maps the errors of the contract that say what became of
// the call to its result, or returns 0.
func sentinelResult(kind opKind, err error) result {
	switch {
	case kind == opReserve:
	case errors.Is(err, idemstore.ErrLeaseLost) && kind != opGet:
		return resLeaseLost
	case errors.Is(err, idemstore.ErrNotFound) && (kind == opGet || kind == opResolve || kind == opDelete):
		return resNotFound
	case errors.Is(err, idemstore.ErrNotNeedsReview) && kind == opResolve:
		return resNotNeedsReview
	case errors.Is(err, idemstore.ErrNotCompleted) && kind == opDelete:
		return resNotCompleted
	}
	return 0
}

// linResponse is the response whose status and body s holds ("201 body7").
func linResponse(s string) *idemstore.Response {
	var status int
	var body string
	if _, err := fmt.Sscanf(s, "%d %s", &status, &body); err != nil {
		panic(err)
	}
	return &idemstore.Response{Status: status, Body: []byte(body)}
}

// keyView is what the workers of one record have seen of it: the state it
// was last seen in, and the tokens that may hold it, newest last.
type keyView struct {
	mu     sync.Mutex
	seen   idemstore.State
	tokens []string
}

func (v *keyView) state() idemstore.State {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.seen
}

// learn notes what a call showed of the record: the state it left the
// record in or saw, and the tokens that are worth trying in fenced calls.
func (v *keyView) learn(in linInput, out linOutput) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case out.unknown:
		// A token that may hold the record, or may not.
		switch in.kind {
		case opReserve:
			v.addToken(in.token, false)
		case opTakeover:
			v.addToken(in.newToken, false)
		}
	case out.result == resExists || in.kind == opGet:
		v.seen = out.record.state
		if out.record.token != "" {
			v.addToken(out.record.token, true)
		}
	case out.result == resCreated:
		v.seen = idemstore.StatePending
		v.addToken(in.token, true)
	case out.result == resNotFound:
		v.seen = ""
	case out.result == resOK:
		switch in.kind {
		case opComplete:
			v.seen = idemstore.StateCompleted
		case opEscalate:
			v.seen = idemstore.StateNeedsReview
		case opExtend:
			v.seen = idemstore.StatePending
		case opTakeover:
			v.seen = idemstore.StatePending
			v.addToken(in.newToken, true)
		case opResolve:
			v.seen = idemstore.StateCompleted
			if in.release {
				v.seen = ""
			}
		case opRelease, opDelete:
			v.seen = ""
		}
	}
}

// addToken adds tok as the newest token, or, when it may not hold the
// record (its call failed), as the second newest.
func (v *keyView) addToken(tok string, holds bool) {
	if i := slices.Index(v.tokens, tok); i >= 0 {
		v.tokens = slices.Delete(v.tokens, i, i+1)
	}
	at := len(v.tokens)
	if !holds && at > 0 {
		at--
	}
	v.tokens = slices.Insert(v.tokens, at, tok)
}

// pick returns the newest token half the time, an older one (which most
// likely just lost the lease) or a token nobody holds otherwise.
func (v *keyView) pick(r *rand.Rand, w *linWorkload) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	age := 0
	for age < 3 && r.IntN(2) == 0 {
		age++
	}
	if age >= len(v.tokens) || age == 3 {
		return w.name("stranger")
	}
	return v.tokens[len(v.tokens)-1-age]
}

// explainIllegal describes the history of one key that is not
// linearizable: its calls in the order they were made, and how far the
// checker got.
func explainIllegal(model porcupine.Model, part []porcupine.Operation, info porcupine.LinearizationInfo) string {
	var b strings.Builder
	var longest []int
	for _, partials := range info.PartialLinearizations() {
		for _, l := range partials {
			if len(l) > len(longest) {
				longest = l
			}
		}
	}
	fmt.Fprintf(&b, "%d of %d calls linearized. The calls in the order they were made ([call, return] ticks; client; * = outcome unknown, may land any time after its call):\n",
		len(longest), len(part))
	order := slices.Clone(part)
	slices.SortStableFunc(order, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
	for _, op := range order {
		mark := " "
		if op.Output.(linOutput).unknown {
			mark = "*"
		}
		fmt.Fprintf(&b, "  %s[%4d, %4d] c%-3d %s", mark, op.Call, op.Return, op.ClientId, model.DescribeOperation(op.Input, op.Output))
		if op.Metadata != nil {
			fmt.Fprintf(&b, "  (%v)", op.Metadata)
		}
		b.WriteByte('\n')
	}
	const shown = 12
	fmt.Fprintf(&b, "The end of the longest linearization found (no call fits after it), with the possible states after each call:\n")
	states := model.Init()
	for i, id := range longest {
		op := part[id]
		_, states = model.Step(states, op.Input, op.Output)
		if i >= len(longest)-shown {
			fmt.Fprintf(&b, "  %s  ⇒ %s\n", model.DescribeOperation(op.Input, op.Output), model.DescribeState(states))
		}
	}
	return b.String()
}

// fault is what a flakyStore does to a call.
type fault uint8

const (
	noFault fault = iota
	// faultRefused fails the call without reaching the store.
	faultRefused
	// faultReplyLost makes the call, then fails it as if its reply was
	// lost.
	faultReplyLost
	// faultCancelled makes the call with a context already cancelled.
	faultCancelled
	// faultCancelledDuring cancels the call's context while it runs.
	faultCancelledDuring
)

func (f fault) String() string {
	return [...]string{"none", "refused", "reply lost", "cancelled", "cancelled during the call"}[f]
}

// pickFault injects a fault into about one call in ten.
func pickFault(r *rand.Rand) fault {
	if r.IntN(10) != 0 {
		return noFault
	}
	return fault(1 + r.IntN(4))
}

type faultKey struct{}

// withFault returns a context that makes a flakyStore inject f.
func withFault(ctx context.Context, f fault) context.Context {
	return context.WithValue(ctx, faultKey{}, f)
}

// flakyStore injects into each call the fault its context carries (see
// withFault). The failures it makes are what a store's callers must expect
// from a network: a call refused before it reached the store, a reply lost
// after the store acted, and the caller's context ending before or while
// the store works.
type flakyStore struct{ idemstore.Store }

func (s flakyStore) inject(ctx context.Context, call func(context.Context) error) error {
	f, _ := ctx.Value(faultKey{}).(fault)
	switch f {
	case faultRefused:
		return fmt.Errorf("injected: connection refused: %w", idemstore.ErrUnavailable)
	case faultReplyLost:
		_ = call(ctx)
		return fmt.Errorf("injected: connection reset before the reply: %w", idemstore.ErrUnavailable)
	case faultCancelled:
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		return call(ctx)
	case faultCancelledDuring:
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Let the call start, then cancel it (while it waits on
			// the network, for a remote store).
			for range 3 {
				runtime.Gosched()
			}
			cancel()
		}()
		err := call(ctx)
		<-done
		return err
	}
	return call(ctx)
}

func (s flakyStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (rec *idemstore.Record, created bool, err error) {
	err = s.inject(ctx, func(ctx context.Context) (err error) {
		rec, created, err = s.Store.Reserve(ctx, p)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return rec, created, nil
}

func (s flakyStore) Get(ctx context.Context, k idemstore.Key) (rec *idemstore.Record, err error) {
	err = s.inject(ctx, func(ctx context.Context) (err error) {
		rec, err = s.Store.Get(ctx, k)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

func (s flakyStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return s.inject(ctx, func(ctx context.Context) error { return s.Store.Complete(ctx, p) })
}

func (s flakyStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	return s.inject(ctx, func(ctx context.Context) error { return s.Store.Release(ctx, p) })
}

func (s flakyStore) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	return s.inject(ctx, func(ctx context.Context) error { return s.Store.Escalate(ctx, p) })
}

func (s flakyStore) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	return s.inject(ctx, func(ctx context.Context) error { return s.Store.Extend(ctx, p) })
}

func (s flakyStore) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	return s.inject(ctx, func(ctx context.Context) error { return s.Store.Takeover(ctx, p) })
}

func (s flakyStore) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	return s.inject(ctx, func(ctx context.Context) error { return s.Store.Resolve(ctx, p) })
}

func (s flakyStore) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	return s.inject(ctx, func(ctx context.Context) error { return s.Store.Delete(ctx, p) })
}
