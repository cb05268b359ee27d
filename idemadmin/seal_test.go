package idemadmin_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemstore"
)

// With the engine's Sealer, operators see sealed keys opened, and the
// answers they store are sealed; without it, the sealed parts are left
// out and the item says why.
func TestKeysSealed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ring, err := idemseal.New(idemseal.Key{ID: "a", Secret: bytes.Repeat([]byte{1}, idemseal.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	store := idemmem.MustNew(idemmem.Config{})
	e, err := idem.NewEngine(store, idem.EngineConfig{Sealer: ring, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	begin := func(key string) *idem.Lease {
		res, err := e.Begin(ctx, idem.Request{Key: idem.Key{Scope: "u", Operation: "POST /pay", Key: key}, Fingerprint: "v1:f",
			Info: &idemstore.Request{Method: "POST", Path: "/pay", Query: "card=SECRET-QUERY", Body: []byte("SECRET-REQUEST")}})
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatal(res.Outcome, err)
		}
		return res.Lease
	}
	if err := begin("done").Complete(ctx, &idem.Response{Status: 201, Header: http.Header{"X-A": {"SECRET-HEADER"}}, Body: []byte("SECRET-BODY")}); err != nil {
		t.Fatal(err)
	}
	if err := begin("review").Escalate(ctx, "unknown"); err != nil {
		t.Fatal(err)
	}

	with := &idemadmin.Keys{Store: store, Sealer: ring, Logger: slog.New(slog.DiscardHandler)}
	without := &idemadmin.Keys{Store: store, Logger: slog.New(slog.DiscardHandler)}
	id := idemadmin.KeyID(idemstore.Key{Scope: "u", Operation: "POST /pay", Key: "done"})

	it, err := with.Get(ctx, id)
	if err != nil || it.Sealed != "" || it.Response.Body == nil || *it.Response.Body != "SECRET-BODY" ||
		it.Response.Headers.Get("X-A") != "SECRET-HEADER" || it.Request.Query != "card=SECRET-QUERY" || it.Request.Body == nil || *it.Request.Body != "SECRET-REQUEST" {
		t.Fatalf("Get with the Sealer: %+v, %v", it, err)
	}
	it, err = without.Get(ctx, id)
	if err != nil || !strings.Contains(it.Sealed, "answer") || !strings.Contains(it.Sealed, "request") ||
		it.Response.Status != 201 || it.Response.BodyBytes != 0 || len(it.Response.Headers) != 0 ||
		it.Request.Method != "POST" || it.Request.Path != "/pay" || it.Request.Query != "" || it.Request.BodyBytes != 0 {
		t.Fatalf("Get without the Sealer: %+v, %v; want status, method and path, and a note", it, err)
	}
	page, err := without.List(ctx, idemadmin.ListQuery{})
	if err != nil || len(page.Items) != 2 {
		t.Fatal(page, err)
	}
	for _, it := range page.Items {
		if it.Sealed == "" || (it.Request != nil && strings.Contains(it.Request.Query, "sealed")) {
			t.Fatalf("listing without the Sealer: %+v", it)
		}
	}

	body := "OPERATOR-SECRET"
	rid := idemadmin.KeyID(idemstore.Key{Scope: "u", Operation: "POST /pay", Key: "review"})
	res, err := with.Resolve(ctx, rid, "ops", idemadmin.ResolveRequest{Action: idemadmin.ActionComplete, Answer: idemadmin.Answer{Status: 200, Body: &body}, Note: "checked", Attempt: idemadmin.AnyAttempt})
	if err != nil || res.Item == nil || res.Item.Response.Status != 200 {
		t.Fatalf("Resolve: %+v, %v", res, err)
	}
	raw, err := store.Get(ctx, idemstore.Key{Scope: "u", Operation: "POST /pay", Key: "review"})
	if err != nil || !idemstore.IsSealedResponse(raw.Response) || bytes.Contains(idemstore.EncodeResponse(raw.Response), []byte(body)) {
		t.Fatalf("an operator's answer stored as %+v, %v; want it sealed", raw.Response, err)
	}
	replay, err := e.Begin(ctx, idem.Request{Key: idem.Key{Scope: "u", Operation: "POST /pay", Key: "review"}, Fingerprint: "v1:f"})
	if err != nil || replay.Outcome != idem.Replayed || string(replay.Response.Body) != body {
		t.Fatalf("replay of an operator's sealed answer: %+v, %v", replay, err)
	}
}

// TestPageShowsSealed: a key whose parts were sealed with keys this server
// does not have says so on its page, instead of showing them as empty.
func TestPageShowsSealed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ring, err := idemseal.New(idemseal.Key{ID: "a", Secret: bytes.Repeat([]byte{2}, idemseal.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	sealing, err := idem.NewEngine(f.store, idem.EngineConfig{Sealer: ring, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	k := key("sealed")
	res, err := sealing.Begin(context.Background(), idem.Request{Key: k, Fingerprint: "v1:f",
		Info: &idemstore.Request{Method: "POST", Path: "/payments", Body: []byte("SECRET-REQUEST")}})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatal(res.Outcome, err)
	}
	if err := res.Lease.Escalate(context.Background(), "reset"); err != nil {
		t.Fatal(err)
	}
	b := f.browser()
	b.signIn(opsToken)
	p := b.get("/keys/" + idemadmin.KeyID(k))
	wantPage(t, "sealed key", p, 200, "<dt>Sealed</dt>", "request: ", "encryption keys")
	if strings.Contains(p.body, "SECRET-REQUEST") {
		t.Error("the page shows the sealed request body")
	}

	plain := key("plain")
	if err := f.begin(plain, nil).Escalate(context.Background(), "reset"); err != nil {
		t.Fatal(err)
	}
	if p := b.get("/keys/" + idemadmin.KeyID(plain)); strings.Contains(p.body, "<dt>Sealed</dt>") {
		t.Error("a key stored in clear is shown as sealed")
	}
}
