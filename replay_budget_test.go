package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/replaygate"
)

// readCountingStore is a memory store that counts the answer bytes it
// hands out, whole in Reserve's records or through ReadResponse, and lets
// a test act just before ReadResponse reads (a purge, a blip, a client
// gone).
type readCountingStore struct {
	*idemmem.Store
	handedOut atomic.Int64
	reads     atomic.Int32
	// beforeRead, if set, runs before each ReadResponse; an error it
	// returns is ReadResponse's.
	beforeRead func(ctx context.Context, key idemstore.Key, token string) error
}

func (s *readCountingStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	rec, created, err := s.Store.Reserve(ctx, p)
	if rec != nil && rec.Response != nil {
		s.handedOut.Add(int64(len(rec.Response.Body)))
	}
	return rec, created, err
}

func (s *readCountingStore) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	s.reads.Add(1)
	if s.beforeRead != nil {
		if err := s.beforeRead(ctx, key, token); err != nil {
			return nil, err
		}
	}
	resp, err := s.Store.ReadResponse(ctx, key, token)
	if resp != nil {
		s.handedOut.Add(int64(len(resp.Body)))
	}
	return resp, err
}

// stallWriter is a client that does not read its answer: its first Write
// of a 2xx answer blocks until release is closed (then takes all, or, with
// fail, half of it and an error, as a connection cut by its write timeout
// does).
type stallWriter struct {
	h       http.Header
	status  int
	body    bytes.Buffer
	once    sync.Once
	wrote   chan struct{} // closed at the first Write
	release chan struct{}
	fail    bool
}

func newStallWriter() *stallWriter {
	return &stallWriter{h: http.Header{}, wrote: make(chan struct{}), release: make(chan struct{})}
}

func (w *stallWriter) Header() http.Header { return w.h }
func (w *stallWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *stallWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.status >= 300 { // a problem document: small, the kernel takes it
		return w.body.Write(b)
	}
	w.once.Do(func() { close(w.wrote) })
	<-w.release
	if w.fail {
		w.body.Write(b[:len(b)/2])
		return len(b) / 2, errors.New("write timeout")
	}
	return w.body.Write(b)
}

// budgetRig is the middleware over a readCountingStore, whose handler
// answers 201 with an answer of size bytes naming its run, and whose
// requests carry gate, as idem serve's do.
type budgetRig struct {
	store *readCountingStore
	e     *idem.Engine
	h     http.Handler // the middleware over next
	next  http.Handler
	gate  *idem.Budget
	runs  atomic.Int32
	size  int
}

func newBudgetRig(t *testing.T, size int, budget int64, ecfg idem.EngineConfig) *budgetRig {
	t.Helper()
	rg := &budgetRig{store: &readCountingStore{Store: idemmem.MustNew(idemmem.Config{})}, gate: idem.NewBudget(budget), size: size}
	t.Cleanup(func() { rg.store.Close() })
	ecfg.Logger = slog.New(slog.DiscardHandler)
	e, err := idem.NewEngine(rg.store, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	rg.e = e
	rg.next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		w.Write(rg.answer(int(rg.runs.Add(1))))
	})
	rg.h = idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(rg.next)
	return rg
}

// answer is the body of the handler's run n.
func (rg *budgetRig) answer(n int) []byte {
	prefix := fmt.Sprintf("run %d;", n)
	return append([]byte(prefix), bytes.Repeat([]byte("x"), rg.size-len(prefix))...)
}

// request is a protected POST with key, carrying the rig's gate.
func (rg *budgetRig) request(ctx context.Context, key string) *http.Request {
	r := httptest.NewRequestWithContext(replaygate.With(ctx, rg.gate), http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	return r
}

// ask sends key and returns the answer whole.
func (rg *budgetRig) ask(t *testing.T, key string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	rg.h.ServeHTTP(w, rg.request(t.Context(), key))
	return w
}

// wantRanOnceAndEmpty requires that the handler ran once in all and that
// nothing is left held of the gate.
func (rg *budgetRig) wantRanOnceAndEmpty(t *testing.T) {
	t.Helper()
	if n := rg.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	rg.wantEmpty(t)
}

// wantEmpty requires that nothing is left held of the gate.
// stallReplay starts a replay of key into a writer that stalls once
// written to, and records in during what the budget held when the stored
// answer was read; done is closed once the replay has answered.
func (rg *budgetRig) stallReplay(t *testing.T, key string) (w *stallWriter, during *atomic.Int64, done chan struct{}) {
	during = new(atomic.Int64)
	rg.store.beforeRead = func(context.Context, idemstore.Key, string) error {
		during.Store(rg.gate.Used())
		return nil
	}
	w = newStallWriter()
	done = make(chan struct{})
	go func() {
		defer close(done)
		rg.h.ServeHTTP(w, rg.request(t.Context(), key))
	}()
	return w, during, done
}

func (rg *budgetRig) wantEmpty(t *testing.T) {
	t.Helper()
	if used := rg.gate.Used(); used != 0 {
		t.Errorf("%d bytes of the replay budget still held once every request was done", used)
	}
}

// Retries of a large stored answer whose clients do not read it hold at
// most the replay budget's worth of answers: the engine reads an answer
// from the store only once the budget admitted it, and the retries it did
// not admit get 503 busy without their answer ever read. Before, every
// retry read the answer (400 clients, 400 answers) before the budget was
// asked.
func TestReplayReadsLargeAnswersWithinTheBudget(t *testing.T) {
	t.Parallel()
	const size, n = 64 << 10, 16
	rg := newBudgetRig(t, size, 4*size, idem.EngineConfig{})
	if w := rg.ask(t, "k"); w.Code != http.StatusCreated {
		t.Fatalf("first answer %d", w.Code)
	}
	rg.store.handedOut.Store(0)

	type result struct {
		w       *stallWriter
		stalled bool
	}
	events := make(chan result, 2*n)
	writers := make([]*stallWriter, n)
	var wg sync.WaitGroup
	for i := range writers {
		w := newStallWriter()
		writers[i] = w
		wg.Go(func() {
			done := make(chan struct{})
			go func() {
				select {
				case <-w.wrote:
					events <- result{w, true}
				case <-done:
				}
			}()
			rg.h.ServeHTTP(w, rg.request(t.Context(), "k"))
			close(done)
			select {
			case <-w.wrote: // reported as stalled
			default:
				events <- result{w, false}
			}
		})
	}
	stalled, refused := 0, 0
	for range n {
		ev := <-events
		if ev.stalled {
			stalled++
			continue
		}
		refused++
		if ev.w.status != http.StatusServiceUnavailable || ev.w.h.Get("Idempotency-Outcome") != idem.SituationBusy.Name {
			t.Errorf("a retry that was not written: %d %q; want 503 busy", ev.w.status, ev.w.h.Get("Idempotency-Outcome"))
		}
	}
	// Every retry is now stalled in its write or was refused.
	if stalled == 0 || int64(stalled)*size > rg.gate.Max() {
		t.Errorf("%d replays held at once, of %d bytes each, within a budget of %d", stalled, size, rg.gate.Max())
	}
	if got, want := rg.store.handedOut.Load(), int64(stalled)*size; got != want {
		t.Errorf("the store handed out %d bytes of answers to %d stalled and %d refused retries; want %d, the stalled ones' alone", got, stalled, refused, want)
	}
	for _, w := range writers {
		close(w.release)
	}
	wg.Wait()
	for _, w := range writers {
		if w.status == http.StatusCreated && !bytes.Equal(w.body.Bytes(), rg.answer(1)) {
			t.Errorf("a replay wrote %d bytes that are not the stored answer", w.body.Len())
		}
	}
	rg.wantRanOnceAndEmpty(t)
}

// A record deleted (or purged) between the read that found it completed
// and the read of its answer is missing, as for a retry that came a moment
// later: the retry reserves the key and runs, and gets its own answer,
// never the deleted one's. A record deleted and stored again meanwhile
// replays the answer stored again.
func TestReplayOfARecordGoneBeforeItsAnswerIsRead(t *testing.T) {
	t.Parallel()
	const size = 32 << 10
	t.Run("Deleted", func(t *testing.T) {
		t.Parallel()
		rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{})
		rg.ask(t, "k")
		var once sync.Once
		rg.store.beforeRead = func(ctx context.Context, key idemstore.Key, token string) error {
			var err error
			once.Do(func() { err = rg.store.Delete(ctx, idemstore.DeleteParams{Key: key, Token: token}) })
			return err
		}
		w := rg.ask(t, "k")
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" || !bytes.Equal(w.Body.Bytes(), rg.answer(2)) {
			t.Fatalf("retry of a record deleted before its answer was read: %d, replayed %q, body %.8q; want the second run's answer",
				w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.String())
		}
		if n := rg.runs.Load(); n != 2 {
			t.Errorf("the handler ran %d times, want 2", n)
		}
		rg.wantEmpty(t)
	})
	t.Run("ReservedAgain", func(t *testing.T) {
		// Deleted, and reserved by another request that is still at work:
		// in flight, not run, not the deleted answer.
		t.Parallel()
		rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{})
		rg.ask(t, "k")
		var once sync.Once
		rg.store.beforeRead = func(ctx context.Context, key idemstore.Key, token string) error {
			var err error
			once.Do(func() {
				rec, gerr := rg.store.Get(ctx, key)
				if gerr != nil {
					err = gerr
					return
				}
				if err = rg.store.Delete(ctx, idemstore.DeleteParams{Key: key, Token: token}); err != nil {
					return
				}
				_, _, err = rg.store.Store.Reserve(ctx, idemstore.ReserveParams{Key: key, Fingerprint: rec.Fingerprint, Token: "other-token", Lease: 1 << 40})
			})
			return err
		}
		w := rg.ask(t, "k")
		if w.Code != http.StatusConflict || w.Header().Get("Idempotency-Outcome") != idem.SituationInFlight.Name {
			t.Fatalf("retry of a record reserved again before its answer was read: %d %q; want 409 in flight", w.Code, w.Header().Get("Idempotency-Outcome"))
		}
		rg.wantRanOnceAndEmpty(t)
	})
	t.Run("StoredAgain", func(t *testing.T) {
		t.Parallel()
		rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{})
		rg.ask(t, "k")
		other := bytes.Repeat([]byte("o"), size)
		var once sync.Once
		rg.store.beforeRead = func(ctx context.Context, key idemstore.Key, token string) error {
			var err error
			once.Do(func() {
				rec, gerr := rg.store.Get(ctx, key)
				if gerr != nil {
					err = gerr
					return
				}
				if err = rg.store.Delete(ctx, idemstore.DeleteParams{Key: key, Token: token}); err != nil {
					return
				}
				p := idemstore.ReserveParams{Key: key, Fingerprint: rec.Fingerprint, Token: "other-token", Lease: rec.LeaseUntil.Sub(rec.CreatedAt) + 1}
				if _, _, err = rg.store.Store.Reserve(ctx, p); err != nil {
					return
				}
				err = rg.store.Complete(ctx, idemstore.CompleteParams{Key: key, Token: "other-token", Retention: 1 << 40,
					Response: &idemstore.Response{Status: http.StatusAccepted, Body: other}})
			})
			return err
		}
		w := rg.ask(t, "k")
		if w.Code != http.StatusAccepted || !bytes.Equal(w.Body.Bytes(), other) {
			t.Fatalf("retry of a record stored again before its answer was read: %d, body %.8q; want the answer stored again", w.Code, w.Body.String())
		}
		if n := rg.runs.Load(); n != 1 {
			t.Errorf("the handler ran %d times, want 1", n)
		}
		if n := rg.store.reads.Load(); n != 2 {
			t.Errorf("%d reads of an answer, want 2 (the deleted one's, then the one stored again)", n)
		}
		rg.wantEmpty(t)
	})
}

// A store that fails to read an answer it found (a blip), or a client
// gone while it is read, is answered as a failed Begin: 503 and not run,
// or nothing; the budget is given back, and the next retry replays.
func TestReplayReadFailsAfterTheRecordWasFound(t *testing.T) {
	t.Parallel()
	const size = 32 << 10
	t.Run("Blip", func(t *testing.T) {
		t.Parallel()
		rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{})
		rg.ask(t, "k")
		var fail atomic.Bool
		fail.Store(true)
		rg.store.beforeRead = func(context.Context, idemstore.Key, string) error {
			if fail.Swap(false) {
				return fmt.Errorf("connection reset: %w", idemstore.ErrUnavailable)
			}
			return nil
		}
		w := rg.ask(t, "k")
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Idempotency-Outcome") != idem.SituationUnavailable.Name {
			t.Fatalf("a blip reading the answer: %d %q; want 503 unavailable", w.Code, w.Header().Get("Idempotency-Outcome"))
		}
		rg.wantEmpty(t)
		if w := rg.ask(t, "k"); w.Code != http.StatusCreated || !bytes.Equal(w.Body.Bytes(), rg.answer(1)) {
			t.Errorf("the retry after the blip: %d; want the stored answer", w.Code)
		}
		rg.wantRanOnceAndEmpty(t)
	})
	t.Run("ClientGone", func(t *testing.T) {
		t.Parallel()
		rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{})
		rg.ask(t, "k")
		ctx, cancel := context.WithCancel(t.Context())
		rg.store.beforeRead = func(rctx context.Context, _ idemstore.Key, _ string) error {
			cancel()
			return rctx.Err()
		}
		w := httptest.NewRecorder()
		rg.h.ServeHTTP(w, rg.request(ctx, "k"))
		if w.Body.Len() != 0 && w.Code == http.StatusCreated {
			t.Errorf("a client gone while its answer was read was written %d bytes", w.Body.Len())
		}
		rg.wantEmpty(t)
		if n := rg.runs.Load(); n != 1 {
			t.Errorf("the handler ran %d times, want 1", n)
		}
	})
}

// Whatever becomes of many concurrent replays (written, refused, cut off
// half way by their client's write timeout, their client gone while the
// answer was read, the store failing the read, the answer not opening),
// the replay budget is all given back.
func TestReplayBudgetIsGivenBackOnEveryPath(t *testing.T) {
	t.Parallel()
	const size, n = 16 << 10, 48
	rg := newBudgetRig(t, size, 5*size, idem.EngineConfig{Sealer: keyring(t, "k1")})
	rg.ask(t, "k")
	var calls atomic.Int32
	rg.store.beforeRead = func(ctx context.Context, _ idemstore.Key, _ string) error {
		switch calls.Add(1) % 4 {
		case 1:
			return idemstore.ErrUnavailable
		case 2:
			return ctx.Err() // nil unless the client is gone
		}
		return nil
	}
	// A second engine, without the key that sealed the answer, on the same
	// store: the answer it reads does not open.
	e2, err := idem.NewEngine(rg.store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sealedOut := idem.Middleware(e2, idem.Config{Scope: idem.GlobalScope})(http.NotFoundHandler())
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			w := newStallWriter()
			h := rg.h
			switch i % 4 {
			case 0:
				w.fail = true // cut off half way
			case 1:
				cancel() // gone before its answer is read
			case 2:
				h = sealedOut
			}
			close(w.release)
			h.ServeHTTP(w, rg.request(ctx, "k"))
			if i%4 == 2 && w.status != http.StatusInternalServerError && w.status != http.StatusServiceUnavailable {
				t.Errorf("a replay of an answer that does not open: %d; want 500 (or 503 busy)", w.status)
			}
		})
	}
	wg.Wait()
	if n := rg.store.reads.Load(); n == 0 {
		t.Error("no answer was read apart from its record")
	}
	rg.wantRanOnceAndEmpty(t)
}

// A large answer stored coded and replayed decoded to a retry that does
// not accept the coding, through a sealed store: the bytes the client
// gets are the answer's, and the budget is given back.
func TestReplayReadApartIsTheStoredAnswer(t *testing.T) {
	t.Parallel()
	const size = 64 << 10
	rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{Sealer: keyring(t, "k1")})
	rg.ask(t, "k")
	for range 3 {
		w := rg.ask(t, "k")
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(w.Body.Bytes(), rg.answer(1)) {
			t.Fatalf("replay %d, replayed %q, %d bytes; want the stored answer", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.Len())
		}
		rg.wantEmpty(t)
	}
	if n := rg.store.reads.Load(); n != 3 {
		t.Errorf("%d answers read apart from their record, want 3", n)
	}
}

// A wrapper of the store that passes InlineResponse on but hides
// ReadResponse (one written before it existed) still replays large
// answers: they are read through Get once admitted.
func TestReplayThroughAWrapperThatHidesReadResponse(t *testing.T) {
	t.Parallel()
	const size = 64 << 10
	rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{})
	e, err := idem.NewEngine(struct{ idemstore.Store }{rg.store}, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rg.h = idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(rg.next)
	rg.ask(t, "k")
	rg.store.handedOut.Store(0)
	w := rg.ask(t, "k")
	if n := rg.store.handedOut.Load(); n != 0 {
		t.Errorf("Reserve handed out %d bytes of the answer through the wrapper; want it left out, and read once admitted", n)
	}
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(w.Body.Bytes(), rg.answer(1)) {
		t.Fatalf("replay through the wrapper: %d, replayed %q, %d bytes", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.Len())
	}
	if n := rg.store.reads.Load(); n != 0 {
		t.Errorf("%d reads through the hidden ReadResponse", n)
	}
	rg.wantEmpty(t)
}

// With Config.FailOpen, a blip on the read of an answer whose record was
// found completed must not run the handler again: the key is known to be
// used, so running it unprotected is a certain duplicate, not a guess (as
// a record that does not open, ErrSealed, is never failed open either).
// The client gets 503 unavailable, and its retry the stored answer.
func TestReplayReadBlipDoesNotFailOpen(t *testing.T) {
	t.Parallel()
	const size = 32 << 10
	rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{})
	rg.h = idem.Middleware(rg.e, idem.Config{Scope: idem.GlobalScope, FailOpen: true})(rg.next)
	if w := rg.ask(t, "k"); w.Code != http.StatusCreated {
		t.Fatalf("first answer %d", w.Code)
	}
	var fail atomic.Bool
	fail.Store(true)
	rg.store.beforeRead = func(context.Context, idemstore.Key, string) error {
		if fail.Swap(false) {
			return fmt.Errorf("connection reset: %w", idemstore.ErrUnavailable)
		}
		return nil
	}
	w := rg.ask(t, "k")
	if n := rg.runs.Load(); n != 1 {
		t.Fatalf("a blip reading the stored answer ran the handler again (%d runs, answer %d %q); want 503, not run",
			n, w.Code, w.Header().Get("Idempotency-Outcome"))
	}
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Idempotency-Outcome") != idem.SituationUnavailable.Name {
		t.Fatalf("a blip reading the answer: %d %q; want 503 unavailable", w.Code, w.Header().Get("Idempotency-Outcome"))
	}
	rg.wantEmpty(t)
	if w := rg.ask(t, "k"); w.Code != http.StatusCreated || !bytes.Equal(w.Body.Bytes(), rg.answer(1)) {
		t.Errorf("the retry after the blip: %d; want the stored answer", w.Code)
	}
	rg.wantEmpty(t)
}

// headCountingStore is readCountingStore that also counts the answer bytes
// Get and GetHead hand out, and tells when Reserve found the key in
// flight.
type headCountingStore struct {
	*readCountingStore
	got      atomic.Int64
	inFlight chan struct{}
}

func (s *headCountingStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	rec, created, err := s.readCountingStore.Reserve(ctx, p)
	if rec != nil && rec.State == idemstore.StatePending {
		select {
		case s.inFlight <- struct{}{}:
		default:
		}
	}
	return rec, created, err
}

func (s *headCountingStore) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	rec, err := s.readCountingStore.Get(ctx, key)
	if rec != nil && rec.Response != nil {
		s.got.Add(int64(len(rec.Response.Body)))
	}
	return rec, err
}

func (s *headCountingStore) GetHead(ctx context.Context, key idemstore.Key, inline int) (*idemstore.Record, error) {
	rec, err := s.readCountingStore.GetHead(ctx, key, inline)
	if rec != nil && rec.Response != nil {
		s.got.Add(int64(len(rec.Response.Body)))
	}
	return rec, err
}

// A duplicate that waits for the request in flight (Policy.Wait) polls the
// record only for its state: when the first request completes with a large
// answer, the waiter must not read that answer whole outside the replay
// budget (many waiters, many answers), but replay it through the budget.
func TestWaiterDoesNotReadTheAnswer(t *testing.T) {
	t.Parallel()
	const size = 64 << 10
	rg := newBudgetRig(t, size, 1<<20, idem.EngineConfig{})
	store := &headCountingStore{readCountingStore: rg.store, inFlight: make(chan struct{}, 1)}
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		rg.next.ServeHTTP(w, r)
	})
	h := idem.Middleware(e, idem.Config{Scope: idem.GlobalScope, Policy: idem.Policy{Wait: time.Minute}})(next)
	ask := func(out chan<- *httptest.ResponseRecorder) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, rg.request(t.Context(), "k"))
		out <- w
	}
	first, second := make(chan *httptest.ResponseRecorder, 1), make(chan *httptest.ResponseRecorder, 1)
	go ask(first)
	<-entered
	go ask(second)
	<-store.inFlight // the duplicate found the key in flight, and waits
	close(release)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatalf("first answer %d", w.Code)
	}
	if w := <-second; w.Code != http.StatusCreated || !bytes.Equal(w.Body.Bytes(), rg.answer(1)) {
		t.Fatalf("the duplicate that waited: %d %q; want the first's answer", w.Code, w.Header().Get("Idempotency-Outcome"))
	}
	if n := store.got.Load(); n != 0 {
		t.Errorf("the duplicate's wait read %d bytes of the answer outside the replay budget; want none", n)
	}
	rg.wantRanOnceAndEmpty(t)
}

// While a large answer is read apart, the replay budget holds twice its
// stored size (the driver's bytes and the decoded answer), and four times
// when the engine seals (the sealed answer, and the opened bytes and their
// decoded answer, too); once it is read, the answer's own length alone.
func TestReplayReadChargesWhatTheReadHolds(t *testing.T) {
	t.Parallel()
	const size = 64 << 10
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) idem.EngineConfig
		want int64
	}{
		{"clear", func(*testing.T) idem.EngineConfig { return idem.EngineConfig{} }, 2},
		{"sealed", func(t *testing.T) idem.EngineConfig { return idem.EngineConfig{Sealer: keyring(t, "k1")} }, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rg := newBudgetRig(t, size, 1<<20, tc.cfg(t))
			rg.ask(t, "k")
			w, during, done := rg.stallReplay(t, "k")
			<-w.wrote // the answer is read and being written
			held := rg.gate.Used()
			close(w.release)
			<-done
			if got := during.Load(); got < tc.want*size || got >= (tc.want+1)*size {
				t.Errorf("the budget held %d bytes while an answer of %d was read; want %d× its stored size", got, size, tc.want)
			}
			if held != size {
				t.Errorf("the budget held %d bytes while the answer was written; want its length, %d", held, size)
			}
			if w.status != http.StatusCreated || !bytes.Equal(w.body.Bytes(), rg.answer(1)) {
				t.Errorf("replay %d of %d bytes; want the stored answer", w.status, w.body.Len())
			}
			rg.wantEmpty(t)
		})
	}
}

// An answer larger than the whole replay budget, sealed or not, is still
// replayed when the budget is free: it holds the whole budget (never more)
// while it is read and written, a replay beside it gets 503 busy, and
// everything is given back.
func TestReplayOfAnAnswerLargerThanTheBudget(t *testing.T) {
	t.Parallel()
	const size, budget = 64 << 10, 16 << 10
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) idem.EngineConfig
	}{
		{"clear", func(*testing.T) idem.EngineConfig { return idem.EngineConfig{} }},
		{"sealed", func(t *testing.T) idem.EngineConfig { return idem.EngineConfig{Sealer: keyring(t, "k1")} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rg := newBudgetRig(t, size, budget, tc.cfg(t))
			rg.ask(t, "k")
			w, during, done := rg.stallReplay(t, "k")
			select {
			case <-w.wrote: // the answer is read and being written
			case <-done:
				t.Fatalf("the replay was answered %d %v; want the stored answer", w.status, w.h)
			}
			held := rg.gate.Used()
			beside := rg.ask(t, "k")
			close(w.release)
			<-done
			if got := during.Load(); got != budget {
				t.Errorf("the budget held %d bytes while the answer was read; want all of it, %d", got, budget)
			}
			if held != budget {
				t.Errorf("the budget held %d bytes while the answer was written; want all of it, %d", held, budget)
			}
			if beside.Code != http.StatusServiceUnavailable || beside.Header().Get("Idempotency-Outcome") != "busy" {
				t.Errorf("a replay beside it: %d %v; want 503 busy", beside.Code, beside.Header())
			}
			if w.status != http.StatusCreated || !bytes.Equal(w.body.Bytes(), rg.answer(1)) {
				t.Errorf("replay %d of %d bytes; want the stored answer", w.status, w.body.Len())
			}
			rg.wantEmpty(t)
			if again := rg.ask(t, "k"); again.Code != http.StatusCreated || !bytes.Equal(again.Body.Bytes(), rg.answer(1)) {
				t.Errorf("a replay once the budget is free: %d", again.Code)
			}
			rg.wantEmpty(t)
		})
	}
}
