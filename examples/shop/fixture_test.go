package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/testenv"
)

// The databases the shop's tests run on: SQLite always; PostgreSQL when
// IDEM_TEST_POSTGRES_URL is set (skipped otherwise, failing when CI=true).
const (
	onSQLite   = "sqlite"
	onPostgres = "postgres"
)

// onEach runs test on each database, in parallel.
func onEach(t *testing.T, test func(t *testing.T, backend string)) {
	t.Helper()
	for _, b := range []string{onSQLite, onPostgres} {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			test(t, b)
		})
	}
}

// testShop is a shop and its payment provider on loopback, with a clock
// the test moves.
type testShop struct {
	t       *testing.T
	backend string
	clk     *fakeClock
	logs    *syncBuffer
	log     *slog.Logger
	dir     string
	pgURL   string // with the schema of this test, when on PostgreSQL
	pgSch   string

	// wrap, if set, wraps the shop's handler in its server.
	wrap func(http.Handler) http.Handler
	// events receives what the middleware reports of every protected
	// request, once it is settled.
	events chan idem.Event

	prov    *provider
	provSrv *httptest.Server
	db      database
	shop    *shop
	srv     *httptest.Server
}

func newTestShop(t *testing.T, backend string, opts ...func(*testShop)) *testShop {
	t.Helper()
	ts := &testShop{t: t, backend: backend, clk: newFakeClock(), logs: &syncBuffer{}, dir: t.TempDir(), events: make(chan idem.Event, 1024)}
	for _, o := range opts {
		o(ts)
	}
	ts.log = slog.New(slog.NewTextHandler(ts.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if backend == onPostgres {
		ts.pgURL = testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
		ts.pgSch = "shop_t_" + randomHex(6)
		t.Cleanup(ts.dropSchema)
	}
	var err error
	ts.prov, err = openProvider(filepath.Join(ts.dir, "provider.db"), ts.clk, ts.log)
	if err != nil {
		t.Fatal(err)
	}
	ts.provSrv = httptest.NewServer(ts.prov.handler())
	t.Cleanup(func() {
		ts.provSrv.Close()
		ts.prov.close()
	})
	ts.start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("shop logs:\n%s", ts.logs)
		}
	})
	return ts
}

// start opens the database and starts a shop over it: a new process, as
// far as the shop can tell.
func (ts *testShop) start() {
	t := ts.t
	t.Helper()
	var err error
	if ts.backend == onPostgres {
		ts.db, err = openPostgres(t.Context(), ts.pgURL, ts.pgSch)
	} else {
		ts.db, err = openSQLite(filepath.Join(ts.dir, "shop.db"), ts.clk)
	}
	if err != nil {
		t.Fatal(err)
	}
	db := ts.db
	t.Cleanup(func() {
		if ts.db == db { // restart closed the others
			db.close()
		}
	})
	pay := &payments{base: ts.provSrv.URL, hc: ts.provSrv.Client(), timeout: 10 * time.Second, clk: ts.clk}
	ts.shop, err = newShop(t.Context(), shopConfig{DB: db, Payments: pay, Clock: ts.clk, Logger: ts.log, Lease: 30 * time.Second,
		OnOutcome: func(ev idem.Event) {
			select {
			case ts.events <- ev:
			default: // a test that does not read them
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := ts.shop.handler()
	if ts.wrap != nil {
		h = ts.wrap(h)
	}
	ts.srv = httptest.NewServer(h)
	t.Cleanup(ts.srv.Close)
}

// restart stops the shop, as if its process had died, and starts a new
// one over the same database and provider.
func (ts *testShop) restart() {
	ts.srv.Close()
	ts.db.close()
	ts.start()
}

func (ts *testShop) dropSchema() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ts.pgURL)
	if err != nil {
		ts.t.Errorf("dropping schema %s: %v", ts.pgSch, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{ts.pgSch}.Sanitize()+" CASCADE"); err != nil {
		ts.t.Errorf("dropping schema %s: %v", ts.pgSch, err)
	}
}

// charges returns what the provider charged (declines left out).
func (ts *testShop) charges() []*charge {
	ts.t.Helper()
	all, err := ts.prov.charges(context.Background())
	if err != nil {
		ts.t.Fatal(err)
	}
	var ok []*charge
	for _, c := range all {
		if c.Status == "succeeded" {
			ok = append(ok, c)
		}
	}
	return ok
}

// count runs a count(*) query.
func (ts *testShop) count(query string, args ...any) int {
	ts.t.Helper()
	var n int
	if err := ts.db.queryRow(context.Background(), query, args...).Scan(&n); err != nil {
		ts.t.Fatal(err)
	}
	return n
}

// orders counts user's orders.
func (ts *testShop) orders(user string) int {
	return ts.count(`SELECT count(*) FROM orders WHERE user_id = ?`, user)
}

func (ts *testShop) stock(sku string) int {
	return ts.count(`SELECT stock FROM products WHERE sku = ?`, sku)
}

// settled waits for the event of the next protected request to op and
// returns it; the events of other operations are passed over.
func (ts *testShop) settled(op string) idem.Event {
	ts.t.Helper()
	for ev := range ts.events {
		if ev.Operation == op {
			return ev
		}
	}
	panic("unreachable")
}

// waitOutcome waits until a protected request to op ends with outcome;
// the events before it are passed over.
func (ts *testShop) waitOutcome(op, outcome string) {
	ts.t.Helper()
	deadline := time.After(time.Minute) // a failsafe, not a synchronisation
	for {
		select {
		case ev := <-ts.events:
			if ev.Operation == op && ev.Outcome == outcome {
				return
			}
		case <-deadline:
			ts.t.Fatalf("no %s request ended %s", op, outcome)
		}
	}
}

// recover runs one recovery pass and returns its report.
func (ts *testShop) recover() idem.RecoverReport {
	ts.t.Helper()
	rep, err := ts.shop.recoverOnce(context.Background())
	if err != nil {
		ts.t.Fatalf("recovery: %v", err)
	}
	return rep
}

// shopClient is one visitor: a cookie jar with the session the shop's page
// gave it.
type shopClient struct {
	ts   *testShop
	hc   *http.Client
	user string
}

func (ts *testShop) visitor() *shopClient {
	t := ts.t
	t.Helper()
	jar, _ := cookiejar.New(nil)
	// No keep-alive: on a reused connection, net/http would resend a POST
	// that carries an Idempotency-Key by itself when the connection drops,
	// and the tests want to see the drop.
	c := &shopClient{ts: ts, hc: &http.Client{Jar: jar, Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}}
	resp, err := c.hc.Get(ts.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, ck := range resp.Cookies() {
		if ck.Name == sessionCookie {
			c.user, _, _ = strings.Cut(ck.Value, ".")
		}
	}
	if resp.StatusCode != 200 || c.user == "" {
		t.Fatalf("GET /: %d, session %q", resp.StatusCode, c.user)
	}
	return c
}

// answer is a response, read.
type answer struct {
	status  int
	header  http.Header
	body    string
	order   order
	problem idem.Problem
	err     error // the request failed: no answer
}

func (a answer) outcome() string { return a.header.Get("Idempotency-Outcome") }

// post sends a JSON POST with key (none when empty).
func (c *shopClient) post(path, key, body string) answer {
	req, err := http.NewRequest(http.MethodPost, c.ts.srv.URL+path, strings.NewReader(body))
	if err != nil {
		c.ts.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(idem.HeaderName, key)
	}
	return c.do(req)
}

func (c *shopClient) do(req *http.Request) answer {
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		_ = json.Unmarshal(b, &a.problem)
	} else {
		_ = json.Unmarshal(b, &a.order)
	}
	return a
}

// want fails the test unless a has status (and, if given, the problem
// type ending in problem, or the Idempotency-Outcome outcome).
func want(t *testing.T, what string, a answer, status int, outcomeOrProblem string) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("%s: %v", what, a.err)
	}
	ok := a.status == status
	if outcomeOrProblem != "" && a.outcome() != outcomeOrProblem && !strings.HasSuffix(a.problem.Type, "#"+outcomeOrProblem) {
		ok = false
	}
	if !ok {
		t.Fatalf("%s: got %d %s %s, want %d %s", what, a.status, a.outcome(), a.body, status, outcomeOrProblem)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// keyOf is the idem key of a request by user to op with key.
func keyOf(user, op, key string) idem.Key { return idem.Key{Scope: user, Operation: op, Key: key} }
