package idem_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// The plaintext the tests look for in stores: if sealing works, none of
// it is ever written.
const (
	secretBody   = `{"card":"4242-SECRET-BODY"}`
	secretHeader = "SECRET-HEADER-VALUE"
	secretQuery  = "token=SECRET-QUERY"
	secretReq    = `{"pan":"SECRET-REQUEST-BODY"}`
)

var secrets = []string{"SECRET-BODY", secretHeader, "SECRET-QUERY", "SECRET-REQUEST-BODY"}

func keyring(t testing.TB, ids ...string) *idemseal.Keyring {
	t.Helper()
	var keys []idemseal.Key
	for _, id := range ids {
		keys = append(keys, idemseal.Key{ID: id, Secret: bytes.Repeat([]byte(id[:1]), idemseal.KeySize)})
	}
	k, err := idemseal.New(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sealedReq(key string) idem.Request {
	r := req(key)
	r.Info = &idemstore.Request{Method: "POST", Path: "/payments", Query: secretQuery, Body: []byte(secretReq)}
	return r
}

var secretAnswer = &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Card": {secretHeader}}, Body: []byte(secretBody)}

// assertNoSecret fails if b holds any of the plaintext.
func assertNoSecret(t *testing.T, what string, b []byte) {
	t.Helper()
	for _, s := range secrets {
		if bytes.Contains(b, []byte(s)) {
			t.Errorf("%s holds %q in clear", what, s)
		}
	}
}

// Through a Sealer, the store holds the answer and the request sealed, and
// every path that reads them gives them back opened.
func TestSealedEngineRoundTrip(t *testing.T) {
	t.Parallel()
	ring := keyring(t, "a")
	e, store := newEngine(t, idem.EngineConfig{Sealer: ring})
	ctx := context.Background()
	res := mustBegin(t, e, sealedReq("k"), idem.Acquired)
	if err := res.Lease.Complete(ctx, secretAnswer); err != nil {
		t.Fatal(err)
	}

	raw, err := store.Get(ctx, req("k").Key)
	if err != nil {
		t.Fatal(err)
	}
	if !idemstore.IsSealedResponse(raw.Response) || raw.Response.Status != 201 || !idemstore.IsSealedRequest(raw.Request) {
		t.Fatalf("stored record %+v: want the answer and request sealed, the status in clear", raw)
	}
	assertNoSecret(t, "the stored answer", idemstore.EncodeResponse(raw.Response))
	assertNoSecret(t, "the stored request", idemstore.EncodeRequest(raw.Request))

	again := mustBegin(t, e, sealedReq("k"), idem.Replayed)
	if string(again.Response.Body) != secretBody || again.Response.Header.Get("X-Card") != secretHeader || again.Response.Status != 201 {
		t.Fatalf("replayed answer %+v", again.Response)
	}
	if again.Record.Response != again.Response || again.Record.Request.Query != secretQuery || string(again.Record.Request.Body) != secretReq {
		t.Fatalf("replayed record %+v: want it opened", again.Record)
	}
	rec, err := e.Get(ctx, req("k").Key)
	if err != nil || string(rec.Response.Body) != secretBody || rec.Request.Query != secretQuery {
		t.Fatalf("Engine.Get = %+v, %v; want it opened", rec, err)
	}
	// A mismatch's record is opened too.
	mm := req("k")
	mm.Fingerprint = "v1:other"
	if got := mustBegin(t, e, mm, idem.Mismatch); got.Record.Request.Query != secretQuery {
		t.Fatalf("mismatch record request %+v", got.Record.Request)
	}
}

// A sealed answer that does not open (no key, another key, moved to
// another record) is neither replayed nor run again.
func TestSealedRecordThatDoesNotOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := idemmem.MustNew(idemmem.Config{})
	sealing, err := idem.NewEngine(store, idem.EngineConfig{Sealer: keyring(t, "a")})
	if err != nil {
		t.Fatal(err)
	}
	res := mustBegin(t, sealing, sealedReq("k"), idem.Acquired)
	if err := res.Lease.Complete(ctx, secretAnswer); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]idemstore.Sealer{"no sealer": nil, "another key": keyring(t, "b")} {
		e, err := idem.NewEngine(store, idem.EngineConfig{Sealer: s})
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.Begin(ctx, sealedReq("k"))
		if !errors.Is(err, idem.ErrSealed) || got.Outcome != 0 || got.Lease != nil {
			t.Fatalf("%s: Begin = %+v, %v; want ErrSealed and nothing acquired", name, got, err)
		}
		if _, err := e.Get(ctx, req("k").Key); !errors.Is(err, idem.ErrSealed) {
			t.Fatalf("%s: Get: %v", name, err)
		}
	}
	// The record is untouched: the key that sealed it still replays it.
	if got := mustBegin(t, sealing, sealedReq("k"), idem.Replayed); string(got.Response.Body) != secretBody {
		t.Fatalf("replay after refusals: %+v", got.Response)
	}

	// Someone with write access to the store copies the sealed answer to
	// another key: it does not open there.
	raw, _ := store.Get(ctx, req("k").Key)
	other := req("other").Key
	if _, _, err := store.Reserve(ctx, idemstore.ReserveParams{Key: other, Fingerprint: req("").Fingerprint, Token: "t", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, idemstore.CompleteParams{Key: other, Token: "t", Response: raw.Response, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := sealing.Begin(ctx, req("other")); !errors.Is(err, idem.ErrSealed) {
		t.Fatalf("Begin of a key holding another key's sealed answer: %v, want ErrSealed", err)
	}
}

// Records stored in clear before a Sealer was set stay readable; an answer
// or request carrying the sealed markers without being sealed is cleaned
// so that it is never taken for a sealed one.
func TestSealerAndPlainRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := idemmem.MustNew(idemmem.Config{})
	plain, _ := idem.NewEngine(store, idem.EngineConfig{})
	res := mustBegin(t, plain, sealedReq("old"), idem.Acquired)
	if err := res.Lease.Complete(ctx, secretAnswer); err != nil {
		t.Fatal(err)
	}
	sealing, _ := idem.NewEngine(store, idem.EngineConfig{Sealer: keyring(t, "a")})
	if got := mustBegin(t, sealing, sealedReq("old"), idem.Replayed); string(got.Response.Body) != secretBody {
		t.Fatalf("a plain answer through a sealing engine: %+v", got.Response)
	}

	marked := &idem.Response{Status: 200, Header: http.Header{idemstore.SealedHeader: {"1"}}, Body: []byte("plain")}
	r := req("marked")
	r.Info = &idemstore.Request{Method: "POST", Path: "/p", Query: idemstore.SealedQuery}
	res = mustBegin(t, plain, r, idem.Acquired)
	if err := res.Lease.Complete(ctx, marked); err != nil {
		t.Fatal(err)
	}
	got := mustBegin(t, plain, r, idem.Replayed)
	if string(got.Response.Body) != "plain" || len(got.Response.Header) != 0 || got.Record.Request.Query != "" {
		t.Fatalf("a plain answer with the marker header replayed as %+v, request %+v", got.Response, got.Record.Request)
	}
}

// lossyStore applies Complete and then reports a lost reply, once.
type lossyStore struct {
	idemstore.Store
	lost atomic.Bool
}

func (s *lossyStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if err := s.Store.Complete(ctx, p); err != nil {
		return err
	}
	if s.lost.CompareAndSwap(false, true) {
		return fmt.Errorf("connection reset after the commit: %w", idemstore.ErrUnavailable)
	}
	return nil
}

// A Complete whose reply was lost reads the record back and recognises its
// own sealed answer, random nonce and all.
func TestSealedCompleteLostReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := &lossyStore{Store: idemmem.MustNew(idemmem.Config{})}
	e, err := idem.NewEngine(store, idem.EngineConfig{Sealer: keyring(t, "a")})
	if err != nil {
		t.Fatal(err)
	}
	res := mustBegin(t, e, req("k"), idem.Acquired)
	if err := res.Lease.Complete(ctx, secretAnswer); err != nil {
		t.Fatalf("Complete with a lost reply: %v", err)
	}
	if !store.lost.Load() {
		t.Fatal("the reply was not lost")
	}
	if got := mustBegin(t, e, req("k"), idem.Replayed); string(got.Response.Body) != secretBody {
		t.Fatalf("replay: %+v", got.Response)
	}
}

// Recovery hands resolvers opened records, and seals what they complete;
// so does ResolveRecord.
func TestSealedRecoverAndResolve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, store := newEngine(t, idem.EngineConfig{Sealer: keyring(t, "a")})
	for _, k := range []string{"r1", "r2"} {
		res := mustBegin(t, e, sealedReq(k), idem.Acquired)
		if err := res.Lease.Escalate(ctx, "unknown"); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	rep, err := e.Recover(ctx, idem.RecoverOptions{Resolver: idem.ResolverFunc(func(_ context.Context, rec *idemstore.Record) (idem.Resolution, error) {
		seen = append(seen, rec.Request.Query)
		if rec.Key.Key != "r1" {
			return idem.Resolution{}, nil
		}
		return idem.Resolution{Verdict: idem.VerdictCompleted, Response: secretAnswer, Reason: "found"}, nil
	})})
	if err != nil || rep.Completed != 1 || strings.Join(seen, ",") != secretQuery+","+secretQuery {
		t.Fatalf("Recover = %+v, %v; the resolver saw queries %q", rep, err, seen)
	}
	if err := e.ResolveRecord(ctx, req("r2").Key, secretAnswer, "by hand"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"r1", "r2"} {
		raw, _ := store.Get(ctx, req(k).Key)
		assertNoSecret(t, k+"'s stored answer", idemstore.EncodeResponse(raw.Response))
		if got := mustBegin(t, e, sealedReq(k), idem.Replayed); string(got.Response.Body) != secretBody {
			t.Fatalf("%s replays %+v", k, got.Response)
		}
	}
}

// sqliteEngine opens a SQLite store in a new directory, closed when t
// ends, and an engine over it with sealer.
func sqliteEngine(t *testing.T, sealer idemstore.Sealer) (string, *sql.DB, *idemsqlite.Store, *idem.Engine) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.NewEngine(store, idem.EngineConfig{Sealer: sealer})
	if err != nil {
		t.Fatal(err)
	}
	return path, db, store, e
}

// On SQLite, with CompleteTx in the caller's transaction, no file of the
// database (db, -wal, -shm) ever holds the answer or the request in clear.
func TestSealedSQLiteFiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path, db, store, e := sqliteEngine(t, keyring(t, "a"))
	res := mustBegin(t, e, sealedReq("plain-complete"), idem.Acquired)
	if err := res.Lease.Complete(ctx, secretAnswer); err != nil {
		t.Fatal(err)
	}
	res = mustBegin(t, e, sealedReq("in-tx"), idem.Acquired)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CompleteTx(ctx, tx, res.Lease, secretAnswer); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	outcome, stored, err := res.Lease.CheckTx(ctx)
	if err != nil || outcome != idem.TxCommitted || string(stored.Body) != secretBody {
		t.Fatalf("CheckTx = %v, %+v, %v; want the opened answer", outcome, stored, err)
	}
	for _, k := range []string{"plain-complete", "in-tx"} {
		if got := mustBegin(t, e, sealedReq(k), idem.Replayed); string(got.Response.Body) != secretBody {
			t.Fatalf("%s replays %+v", k, got.Response)
		}
	}
	files := 0
	for _, suffix := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(path + suffix)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		files++
		assertNoSecret(t, filepath.Base(path+suffix), b)
	}
	if files < 2 {
		t.Fatalf("found %d of the database's files; want the db and its WAL at least", files)
	}
	// The check can fail: without a Sealer, the same run leaves plaintext.
	plainPath, _, _, pe := sqliteEngine(t, nil)
	res = mustBegin(t, pe, sealedReq("k"), idem.Acquired)
	if err := res.Lease.Complete(ctx, secretAnswer); err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, suffix := range []string{"", "-wal"} {
		b, _ := os.ReadFile(plainPath + suffix)
		all = append(all, b...)
	}
	if !bytes.Contains(all, []byte("SECRET-BODY")) {
		t.Fatal("the unsealed control run left no plaintext to find: the check above proves nothing")
	}
}

// The middleware answers a sealed answer that does not open with 500
// answer-sealed, runs nothing, and does not fail open: the operation ran
// once already.
func TestMiddlewareSealedAnswer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{Sealer: keyring(t, "a")}, paymentHandler)
	first := f.do(call{key: "k"})
	if first.Code != http.StatusCreated {
		t.Fatalf("first call: %d %s", first.Code, first.Body)
	}
	if w := f.do(call{key: "k"}); w.Code != http.StatusCreated || w.Body.String() != first.Body.String() || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay through the sealing engine: %d %s", w.Code, w.Body)
	}
	for _, failOpen := range []bool{false, true} {
		e, err := idem.NewEngine(f.store, idem.EngineConfig{Sealer: keyring(t, "b")})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := idem.Middleware(e, idem.Config{Scope: userScope, FailOpen: failOpen})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			w.WriteHeader(http.StatusCreated)
		}))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, f.request(call{key: "k"}))
		if w.Code != http.StatusInternalServerError || problemType(t, w) != idem.ProblemSealed || runs != 0 ||
			w.Header().Get("Idempotency-Outcome") != idem.SituationSealed.Name {
			t.Fatalf("FailOpen %v: %d %s, outcome %q, handler runs %d; want 500 answer-sealed and no run", failOpen, w.Code, w.Body, w.Header().Get("Idempotency-Outcome"), runs)
		}
	}
}

// idem.Do and DoTx store their results through the Sealer, and replay them
// typed.
func TestSealedDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type receipt struct{ Card string }
	e, store := newEngine(t, idem.EngineConfig{Sealer: keyring(t, "a")})
	runs := 0
	job := func(context.Context) (receipt, error) { runs++; return receipt{Card: "SECRET-BODY"}, nil }
	for range 2 {
		got, err := idem.Do(ctx, e, req("job"), job)
		if err != nil || got.Card != "SECRET-BODY" {
			t.Fatalf("Do = %+v, %v", got, err)
		}
	}
	if runs != 1 {
		t.Fatalf("the job ran %d times", runs)
	}
	raw, _ := store.Get(ctx, req("job").Key)
	assertNoSecret(t, "Do's stored result", idemstore.EncodeResponse(raw.Response))

	path, db, _, se := sqliteEngine(t, keyring(t, "a"))
	r := req("tx-job")
	r.Kind = idem.Transactional
	for range 2 {
		got, err := idem.DoTx(ctx, se, r, idem.SQLTx(db, nil), func(context.Context, *sql.Tx) (receipt, error) {
			return receipt{Card: "SECRET-BODY"}, nil
		})
		if err != nil || got.Card != "SECRET-BODY" {
			t.Fatalf("DoTx = %+v, %v", got, err)
		}
	}
	for _, suffix := range []string{"", "-wal"} {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		assertNoSecret(t, filepath.Base(path+suffix), b)
	}
}
