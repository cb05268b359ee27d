package idemadmin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

const (
	opsToken   = "ops-token-0123456789abcdef"
	aliceToken = "alice-token-0123456789abcdef"
)

// fixture is an admin handler over a memory store, with an engine to put
// keys in every state.
type fixture struct {
	t       *testing.T
	store   *idemmem.Store
	engine  *idem.Engine
	handler *idemadmin.Handler
	srv     *httptest.Server
	log     *syncBuffer
	changes chan idemadmin.Result
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newFixture(t *testing.T, tweak ...func(*idemadmin.Config)) *fixture {
	t.Helper()
	store, err := idemmem.New(idemmem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := &fixture{t: t, store: store, log: &syncBuffer{}, changes: make(chan idemadmin.Result, 100)}
	logger := slog.New(slog.NewTextHandler(f.log, nil))
	if f.engine, err = idem.NewEngine(store, idem.EngineConfig{Logger: logger}); err != nil {
		t.Fatal(err)
	}
	cfg := idemadmin.Config{
		Store:    store,
		Tokens:   map[string]string{"ops": opsToken, "alice": aliceToken},
		Logger:   logger,
		OnChange: func(r idemadmin.Result) { f.changes <- r },
	}
	for _, tw := range tweak {
		tw(&cfg)
	}
	if f.handler, err = idemadmin.New(cfg); err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.handler)
	t.Cleanup(f.srv.Close)
	return f
}

func key(k string) idem.Key { return idem.Key{Scope: "tenant-1", Operation: "POST /payments", Key: k} }

// begin acquires k with a request description and returns its lease.
func (f *fixture) begin(k idem.Key, info *idemstore.Request) *idem.Lease {
	f.t.Helper()
	if info == nil {
		method, path, _ := strings.Cut(k.Operation, " ")
		info = &idemstore.Request{Method: method, Path: path, Query: "currency=eur", Body: []byte(`{"amount":100}`)}
	}
	res, err := f.engine.Begin(context.Background(), idem.Request{Key: k, Fingerprint: "fp-" + k.Key, Info: info})
	if err != nil || res.Outcome != idem.Acquired {
		f.t.Fatalf("Begin(%v) = %v, %v", k, res.Outcome, err)
	}
	return res.Lease
}

// review puts k in needs_review.
func (f *fixture) review(k idem.Key) string {
	f.t.Helper()
	if err := f.begin(k, nil).Escalate(context.Background(), "upstream failed after the request was sent: connection reset"); err != nil {
		f.t.Fatal(err)
	}
	return idemadmin.KeyID(k)
}

// complete completes k with a stored answer.
func (f *fixture) complete(k idem.Key) string {
	f.t.Helper()
	resp := &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}
	if err := f.begin(k, nil).Complete(context.Background(), resp); err != nil {
		f.t.Fatal(err)
	}
	return idemadmin.KeyID(k)
}

// attempt returns the attempt of k as the API shows it.
func (f *fixture) attempt(k idem.Key) string {
	f.t.Helper()
	it, err := (&idemadmin.Keys{Store: f.store}).Get(context.Background(), idemadmin.KeyID(k))
	if err != nil || it.Attempt == "" {
		f.t.Fatalf("the attempt of %v: %q, %v", k, it.Attempt, err)
	}
	return it.Attempt
}

// retry begins k again, as a client's retry would, and returns the outcome.
func (f *fixture) retry(k idem.Key) idem.Result {
	f.t.Helper()
	res, err := f.engine.Begin(context.Background(), idem.Request{Key: k, Fingerprint: "fp-" + k.Key})
	if err != nil {
		f.t.Fatal(err)
	}
	return res
}

type apiAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a apiAnswer) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("decoding %s: %v", a.body, err)
	}
}

func (a apiAnswer) code(t *testing.T) string {
	t.Helper()
	var p struct{ Code, Detail string }
	a.decode(t, &p)
	return p.Code
}

// api sends one API request with token ("" for none).
func (f *fixture) api(method, path, token, body string) apiAnswer {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apiAnswer{resp.StatusCode, resp.Header, b}
}

func wantStatus(t *testing.T, what string, a apiAnswer, status int) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: status %d, want %d: %s", what, a.status, status, a.body)
	}
}

func errAs(err error, target **idemadmin.Error) bool { return errors.As(err, target) }
