package idem_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// stored returns the record the engine's store keeps for key.
func stored(t *testing.T, s idemstore.Store, key string) *idemstore.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), req(key).Key)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestScopeLabelKept: a Request's label is kept on the record, cleaned and
// bounded, and a retry with another label changes neither the outcome nor
// the label.
func TestScopeLabelKept(t *testing.T) {
	t.Parallel()
	e, s := newEngine(t, idem.EngineConfig{})
	r := req("k1")
	r.ScopeLabel = "  acct_8842\n"
	res := mustBegin(t, e, r, idem.Acquired)
	if got := stored(t, s, "k1").ScopeLabel; got != "acct_8842" {
		t.Fatalf("stored label %q, want %q", got, "acct_8842")
	}
	if err := res.Lease.Complete(context.Background(), &idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	// The label is never part of the key: another label replays.
	r.ScopeLabel = "someone-else"
	mustBegin(t, e, r, idem.Replayed)
	if got := stored(t, s, "k1").ScopeLabel; got != "acct_8842" {
		t.Fatalf("a retry changed the label to %q", got)
	}

	// Hostile: 10 KB, control characters, invalid UTF-8.
	r = req("k2")
	r.ScopeLabel = "\x1b[31mred\x00" + strings.Repeat("A", 10<<10) + "\xff"
	mustBegin(t, e, r, idem.Acquired)
	got := stored(t, s, "k2").ScopeLabel
	if len(got) > idemstore.MaxScopeLabelLength || strings.ContainsAny(got, "\x1b\x00") || !strings.HasPrefix(got, "\uFFFD[31mred\uFFFD") || !strings.HasSuffix(got, "…") {
		t.Fatalf("a hostile label was kept as %d bytes: %q", len(got), got[:min(len(got), 40)])
	}
}

// TestScopeLabelSealed: with a Sealer, the label is kept sealed (no label
// in clear in the store), yet searchable through the Sealer's indexes; a
// Sealer that cannot seal labels drops it.
func TestScopeLabelSealed(t *testing.T) {
	t.Parallel()
	ring := keyring(t, "k1")
	e, s := newEngine(t, idem.EngineConfig{Sealer: ring})
	r := req("k1")
	r.ScopeLabel = "acct_SECRET"
	mustBegin(t, e, r, idem.Acquired)
	rec := stored(t, s, "k1")
	if !idemstore.IsSealedLabel(rec.ScopeLabel) || strings.Contains(rec.ScopeLabel, "SECRET") {
		t.Fatalf("with a Sealer, the label is stored as %q", rec.ScopeLabel)
	}
	if label, err := ring.OpenLabel(rec.Key, rec.ScopeLabel); err != nil || label != "acct_SECRET" {
		t.Fatalf("OpenLabel = %q, %v", label, err)
	}
	page, err := s.List(context.Background(), idemstore.ListParams{ScopeLabels: ring.ScopeLabelIndexes("acct_SECRET")})
	if err != nil || len(page.Records) != 1 || page.Records[0].Key != rec.Key {
		t.Fatalf("a search by the sealed label's indexes found %d records, %v", len(page.Records), err)
	}

	e2, s2 := newEngine(t, idem.EngineConfig{Sealer: noLabelSealer{ring}})
	mustBegin(t, e2, r, idem.Acquired)
	if got := stored(t, s2, "k1").ScopeLabel; got != "" {
		t.Fatalf("a Sealer that cannot seal labels kept the label %q", got)
	}
}

// noLabelSealer is a Sealer without idemstore.LabelSealer.
type noLabelSealer struct{ idemstore.Sealer }

// TestDoScopeLabel: a job run with Do keeps its Request's label.
func TestDoScopeLabel(t *testing.T) {
	t.Parallel()
	e, s := newEngine(t, idem.EngineConfig{})
	r := req("job-1")
	r.ScopeLabel = "batch-7"
	if _, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, "job-1").ScopeLabel; got != "batch-7" {
		t.Fatalf("Do kept the label %q, want batch-7", got)
	}
}

// TestMiddlewareScopeLabel: Config.ScopeLabel labels the new record; a
// retry of the same credential with another label replays, and the
// record keeps the first label; a hostile label never fails the request
// and is kept cleaned and cut; a request without the header has no label.
func TestMiddlewareScopeLabel(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{ScopeLabel: idem.HeaderScopeLabel("x-account-id")}, idem.EngineConfig{}, paymentHandler)
	send := func(key string, labels ...string) *httptest.ResponseRecorder {
		r := f.request(call{key: key})
		r.Header["X-Account-Id"] = labels
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w
	}
	record := func(key string) *idemstore.Record {
		t.Helper()
		rec, err := f.store.Get(context.Background(), idem.Key{Scope: "user:alice", Operation: "POST /payments", Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	first := send("k1", "acct_8842", "eu")
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	if got := record("k1").ScopeLabel; got != "acct_8842, eu" {
		t.Fatalf("stored label %q, want the header's values joined", got)
	}
	page, err := f.store.List(context.Background(), idemstore.ListParams{ScopeLabels: []string{"acct_8842, eu"}})
	if err != nil || len(page.Records) != 1 || page.Records[0].Key.Key != "k1" {
		t.Fatalf("a search by the label found %+v, %v", page.Records, err)
	}

	again := send("k1", "acct_OTHER")
	if again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() || f.runs.Load() != 1 {
		t.Fatalf("another label did not replay the key: %d %s, %d runs", again.Code, again.Body, f.runs.Load())
	}
	if got := record("k1").ScopeLabel; got != "acct_8842, eu" {
		t.Fatalf("a retry changed the label to %q", got)
	}

	hostile := send("k2", "\x1b[31mred\x00"+strings.Repeat("A", 10<<10)+"\xff", "\u2028x")
	if hostile.Code != http.StatusCreated {
		t.Fatalf("a hostile label failed the request: %d %s", hostile.Code, hostile.Body)
	}
	got := record("k2").ScopeLabel
	if len(got) > idemstore.MaxScopeLabelLength || strings.ContainsAny(got, "\x1b\x00\u2028") || !utf8.ValidString(got) ||
		!strings.HasPrefix(got, "\uFFFD[31mred\uFFFDAAA") || !strings.HasSuffix(got, "…") {
		t.Fatalf("a hostile label was kept as %d bytes: %q", len(got), got)
	}

	if w := send("k3"); w.Code != http.StatusCreated || record("k3").ScopeLabel != "" {
		t.Fatalf("without the header: %d, label %q", w.Code, record("k3").ScopeLabel)
	}
}

// TestMiddlewareScopeLabelSealed: with a Sealer, no file of a SQLite
// store holds the label in clear, yet a search by its indexes finds it
// and it opens to what the request sent.
func TestMiddlewareScopeLabelSealed(t *testing.T) {
	t.Parallel()
	const label = "acct_LABEL_5e1d"
	ring := keyring(t, "k1")
	path, _, store, e := sqliteEngine(t, ring)
	mw, err := idem.NewMiddleware(e, idem.Config{Scope: userScope, ScopeLabel: idem.HeaderScopeLabel("X-Account-Id")})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
	r.Header.Set("X-User", "alice")
	r.Header.Set(idem.HeaderName, "k1")
	r.Header.Set("X-Account-Id", label)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	page, err := store.List(context.Background(), idemstore.ListParams{ScopeLabels: ring.ScopeLabelIndexes(label)})
	if err != nil || len(page.Records) != 1 {
		t.Fatalf("a search by the sealed label's indexes found %d records, %v", len(page.Records), err)
	}
	rec := page.Records[0]
	if opened, err := ring.OpenLabel(rec.Key, rec.ScopeLabel); err != nil || opened != label {
		t.Fatalf("the stored label opens to %q, %v", opened, err)
	}
	for _, suffix := range []string{"", "-wal"} {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("LABEL_5e1d")) {
			t.Fatalf("%s holds the label in clear", filepath.Base(path+suffix))
		}
	}
}

// TestHeaderScopeLabelRefused: NewMiddleware refuses the label of a
// credential header, in any case, and of a name that is not a header
// name; a label function of one's own that reads one is the caller's
// choice.
func TestHeaderScopeLabelRefused(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, idem.EngineConfig{})
	for _, name := range []string{"Authorization", "authorization", "Proxy-Authorization", "COOKIE", "", "X Account", "X-Account:"} {
		_, err := idem.NewMiddleware(e, idem.Config{Scope: idem.GlobalScope, ScopeLabel: idem.HeaderScopeLabel(name)})
		if err == nil || !strings.Contains(err.Error(), "ScopeLabel") {
			t.Errorf("HeaderScopeLabel(%q): NewMiddleware = %v; want it refused", name, err)
		}
		if got := idem.HeaderScopeLabel(name)(httptest.NewRequest(http.MethodPost, "/", nil)); got != "" {
			t.Errorf("HeaderScopeLabel(%q) labels %q", name, got)
		}
	}
	for _, f := range []func(*http.Request) string{
		idem.HeaderScopeLabel("X-Account-Id"), idem.HeaderScopeLabel("x-tenant"),
		func(r *http.Request) string { return r.Header.Get("X-User") },
	} {
		if _, err := idem.NewMiddleware(e, idem.Config{Scope: idem.GlobalScope, ScopeLabel: f}); err != nil {
			t.Errorf("NewMiddleware: %v", err)
		}
	}
}
