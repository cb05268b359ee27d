package idemredis

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// runCounter counts a handler's runs by Idempotency-Key.
type runCounter struct {
	mu   sync.Mutex
	runs map[string]int
}

func newRunCounter() *runCounter { return &runCounter{runs: map[string]int{}} }

func (c *runCounter) of(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[key]
}

func (c *runCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.runs {
		n += r
	}
	return n
}

// handler counts its runs and answers 201 with a 16 KiB body, after
// work(key) when work is set.
func (c *runCounter) handler(work func(key string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		c.mu.Lock()
		c.runs[key]++
		c.mu.Unlock()
		if work != nil {
			work(key)
		}
		w.WriteHeader(answer16k.Status)
		_, _ = w.Write(answer16k.Body)
	})
}

// post sends POST /charges with key to h.
func post(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":1}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// recordOf returns the record of the middleware's key name, found by
// listing.
func recordOf(t *testing.T, s *Store, name string) *idemstore.Record {
	t.Helper()
	page, err := s.List(t.Context(), idemstore.ListParams{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range page.Records {
		if rec.Key.Key == name {
			return rec
		}
	}
	t.Fatalf("no record for %s", name)
	return nil
}

// TestFullUnderNoEviction fills a 3 MB server under noeviction, the policy
// the store accepts, while a request runs, and drives the middleware and
// idem.Do through it: the request whose answer cannot be stored keeps its
// key pending (its client still gets the answer), completed keys replay,
// new keys get 503 problem+json without running anything, the pending key
// answers 409 while its lease lasts and 503 once it has expired (it cannot
// be escalated), and once memory is free again it goes to review instead
// of running again. Nothing runs twice.
func TestFullUnderNoEviction(t *testing.T) {
	t.Parallel()
	c := singleClient(t, throwaway(t, "maxmemory 3mb", "maxmemory-policy noeviction"), rueidis.ClientOption{})
	ctx := t.Context()
	s, err := New(c, Config{Prefix: testPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	// The middleware tries a refused escalation again until the lease
	// would expire before it leaves the key pending: a short lease keeps
	// that wait short.
	eng, err := idem.NewEngine(s, idem.EngineConfig{Lease: time.Second, SettleTimeout: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// fillUp writes values of 16 KiB until the server refuses one, then
	// lowers maxmemory below what the server holds: a refused command's
	// own buffer is freed, and the server trims idle buffers, so a server
	// just over its limit would accept small writes again a moment later.
	var fillers []string
	fillUp := func() {
		for i := 0; ; i++ {
			if i == 1000 {
				t.Error("1000 values of 16 KiB did not fill 3 MB")
				return
			}
			k := fmt.Sprintf("filler:%d", i)
			err := c.Do(context.Background(), c.B().Set().Key(k).Value(string(answer16k.Body)).Build()).Error()
			if err != nil {
				if !strings.HasPrefix(err.Error(), "OOM") {
					t.Errorf("filling: %v", err)
				}
				break
			}
			fillers = append(fillers, k)
		}
		if err := c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "1mb").Build()).Error(); err != nil {
			t.Error(err)
		}
	}
	runs := newRunCounter()
	h := idem.Middleware(eng, idem.Config{Scope: idem.GlobalScope})(runs.handler(func(key string) {
		if key == "during" {
			fillUp()
		}
	}))
	// setLease moves the lease deadline of during (microseconds), lifting
	// the limit for that one write; it stands for the time that passes.
	setLease := func(lu int64) {
		t.Helper()
		key := s.recordKey(recordOf(t, s, "during").Key)
		configSet(t, c, "maxmemory", "0")
		setLeaseUntil(t, c, key, lu)
		configSet(t, c, "maxmemory", "1mb")
	}

	if rec := post(h, "first"); rec.Code != 201 {
		t.Fatalf("POST first: %d %s", rec.Code, rec.Body)
	}
	released := reserve(t, s, "released on the full server", "tok", time.Minute)
	// The server fills up while "during" runs: its answer cannot be
	// stored, nor can the key be escalated; the client gets the answer and
	// the key stays pending.
	if rec := post(h, "during"); rec.Code != 201 || rec.Body.Len() != len(answer16k.Body) {
		t.Fatalf("POST during: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	if rec := recordOf(t, s, "during"); rec.State != idemstore.StatePending {
		t.Fatalf("after its answer could not be stored, during is %s, want pending", rec.State)
	}
	if rec := post(h, "first"); rec.Code != 201 || rec.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of first on the full server: %d, replayed %q", rec.Code, rec.Header().Get("Idempotent-Replayed"))
	}
	// Its answer read apart, as idem serve reads it: both scripts only
	// read, which a full server allows.
	first := recordOf(t, s, "first")
	if rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: first.Key, Fingerprint: first.Fingerprint, Token: "retry", Lease: time.Minute, InlineResponse: 1024}); err != nil || created || rec.Response != nil || rec.ResponseSize == 0 {
		t.Fatalf("Reserve of first with InlineResponse on the full server: %+v, %v, %v", rec, created, err)
	}
	if resp, err := s.ReadResponse(ctx, first.Key, first.Token); err != nil || string(resp.Body) != string(answer16k.Body) {
		t.Fatalf("ReadResponse of first on the full server: %v", err)
	}
	rec := post(h, "new")
	if rec.Code != 503 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json") || !strings.Contains(rec.Body.String(), idem.ProblemUnavailable) {
		t.Fatalf("POST new on the full server: %d %q %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	jobRuns := 0
	_, err = idem.Do(ctx, eng, charge("job"), func(context.Context) (int, error) { jobRuns++; return 1, nil })
	if !errors.Is(err, idemstore.ErrUnavailable) || jobRuns != 0 {
		t.Fatalf("idem.Do on the full server: %v, ran %d times", err, jobRuns)
	}
	// A release deletes first, which a full server allows.
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: released, Token: "tok"}); err != nil {
		t.Fatalf("Release on the full server: %v", err)
	}
	if _, err := s.Get(ctx, released); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("after Release on the full server, Get: %v", err)
	}
	setLease(1 << 62)
	if rec := post(h, "during"); rec.Code != 409 || !strings.Contains(rec.Body.String(), idem.ProblemInFlight) {
		t.Fatalf("retry of during on the full server, leased: %d %s", rec.Code, rec.Body)
	}
	setLease(0)
	if rec := post(h, "during"); rec.Code != 503 || !strings.Contains(rec.Body.String(), idem.ProblemUnavailable) {
		t.Fatalf("retry of during on the full server, lease expired: %d %s", rec.Code, rec.Body)
	}

	// Memory is freed: the expired key goes to review.
	for _, k := range fillers {
		if err := c.Do(ctx, c.B().Del().Key(k).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	configSet(t, c, "maxmemory", "3mb")
	if rec := post(h, "during"); rec.Code != 409 || !strings.Contains(rec.Body.String(), idem.ProblemNeedsReview) {
		t.Fatalf("retry of during after its lease expired: %d %s", rec.Code, rec.Body)
	}
	for _, key := range []string{"first", "during", "new"} {
		if want := map[string]int{"first": 1, "during": 1}[key]; runs.of(key) != want {
			t.Errorf("the handler ran %d times for %s, want %d", runs.of(key), key, want)
		}
	}
}
