package idemadmin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// bulkBody is a bulk request's JSON for keys ks at their current
// attempts.
func (f *fixture) bulkBody(action string, extra map[string]any, ks ...idem.Key) string {
	f.t.Helper()
	req := map[string]any{"action": action}
	var keys []idemadmin.BulkKey
	for _, k := range ks {
		keys = append(keys, idemadmin.BulkKey{ID: idemadmin.KeyID(k), Attempt: f.attempt(k)})
	}
	req["keys"] = keys
	for n, v := range extra {
		req[n] = v
	}
	b, err := json.Marshal(req)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

func outcomes(res idemadmin.BulkResult) string {
	var s []string
	for _, it := range res.Results {
		s = append(s, it.Key+"="+it.Outcome)
	}
	return strings.Join(s, " ")
}

// TestAPIBulkRelease: the keys named are released, each at its attempt,
// each logged on its own line.
func TestAPIBulkRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ks := []idem.Key{key("order-1"), key("order-2"), key("order-3")}
	for _, k := range ks {
		f.review(k)
	}
	a := f.api("POST", "/api/v1/keys/bulk", opsToken, f.bulkBody("release", map[string]any{"note": "provider has none"}, ks...))
	wantStatus(t, "bulk release", a, 200)
	var res idemadmin.BulkResult
	a.decode(t, &res)
	if got := outcomes(res); got != "order-1=settled order-2=settled order-3=settled" || res.Settled != 3 || res.Skipped != 0 {
		t.Fatalf("the result: %s %+v", got, res)
	}
	for _, k := range ks {
		if got := f.retry(k).Outcome; got != idem.Acquired {
			t.Errorf("%s after the bulk release: %v", k.Key, got)
		}
	}
	log := f.log.String()
	if n := strings.Count(log, `msg="admin: key resolved" by=ops action=release`); n != 3 {
		t.Errorf("%d audit lines, want 3:\n%s", n, log)
	}
	if !strings.Contains(log, `msg="admin: bulk action" by=ops action=release keys=3 settled=3 skipped=0`) {
		t.Errorf("no bulk line:\n%s", log)
	}
}

// TestAPIBulkCompleteOneChanged: of the keys named, one went to review
// again under a new attempt, one was settled by someone else and one
// released since they were read: those are skipped and reported, never
// settled, and the others get the answer.
func TestAPIBulkCompleteOneChanged(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ks := []idem.Key{key("a"), key("changed"), key("settled"), key("gone"), key("b")}
	for _, k := range ks {
		f.review(k)
	}
	body := f.bulkBody("complete", map[string]any{"status": 201, "body": `{"charged":true}`, "headers": map[string]string{"Content-Type": "application/json"}}, ks...)
	// Meanwhile: "changed" is released and its retry fails again,
	// "settled" is completed by alice, "gone" is released.
	for _, k := range []idem.Key{key("changed"), key("gone")} {
		wantStatus(t, "release", f.api("POST", "/api/v1/keys/"+idemadmin.KeyID(k)+"/resolve", aliceToken, `{"action":"release","attempt":"*"}`), 200)
	}
	f.review(key("changed"))
	wantStatus(t, "complete", f.api("POST", "/api/v1/keys/"+idemadmin.KeyID(key("settled"))+"/resolve", aliceToken, `{"action":"complete","attempt":"*","status":200,"body":"alice's"}`), 200)

	a := f.api("POST", "/api/v1/keys/bulk", opsToken, body)
	wantStatus(t, "bulk complete", a, 200)
	var res idemadmin.BulkResult
	a.decode(t, &res)
	if got := outcomes(res); got != "a=settled changed=stale_attempt settled=not_needs_review gone=not_found b=settled" || res.Settled != 2 || res.Skipped != 3 {
		t.Fatalf("the result: %s", got)
	}
	for _, it := range res.Results[1:4] {
		if it.Detail == "" {
			t.Errorf("%s skipped without a word", it.Key)
		}
	}
	f.replays(key("a"), `{"charged":true}`)
	f.replays(key("b"), `{"charged":true}`)
	f.replays(key("settled"), "alice's")
	if got := f.retry(key("changed")).Outcome; got != idem.NeedsReview {
		t.Fatalf("the key that changed is %v, want needs_review", got)
	}
	if got := f.retry(key("gone")).Outcome; got != idem.Acquired {
		t.Fatalf("the released key is %v", got)
	}
}

// TestAPIBulkRefuses: requests wrong as a whole change nothing; wrong
// keys are skipped one by one; duplicates settle once; "*" is not taken.
func TestAPIBulkRefuses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := key("order-1")
	id := f.review(k)
	att := f.attempt(k)
	many := func(n int) string {
		keys := make([]idemadmin.BulkKey, n)
		for i := range keys {
			keys[i] = idemadmin.BulkKey{ID: id, Attempt: att}
		}
		b, _ := json.Marshal(map[string]any{"action": "release", "keys": keys})
		return string(b)
	}
	for _, tc := range []struct {
		what, body string
		status     int
		code       string
	}{
		{"no keys", `{"action":"release","keys":[]}`, 400, "bad_request"},
		{"no action", `{"keys":[{"id":"` + id + `","attempt":"` + att + `"}]}`, 400, "bad_request"},
		{"delete", `{"action":"delete","keys":[{"id":"` + id + `","attempt":"` + att + `"}]}`, 400, "bad_request"},
		{"complete without a status", `{"action":"complete","keys":[{"id":"` + id + `","attempt":"` + att + `"}]}`, 400, "bad_request"},
		{"release with a body", `{"action":"release","body":"x","keys":[{"id":"` + id + `","attempt":"` + att + `"}]}`, 400, "bad_request"},
		{"a Set-Cookie answer", `{"action":"complete","status":200,"headers":{"Set-Cookie":"a=b"},"keys":[{"id":"` + id + `","attempt":"` + att + `"}]}`, 400, "bad_request"},
		{"an unknown field", `{"action":"release","attempts":"*","keys":[{"id":"` + id + `","attempt":"` + att + `"}]}`, 400, "bad_request"},
		{"a note too long", `{"action":"release","note":"` + strings.Repeat("n", 1001) + `","keys":[{"id":"` + id + `","attempt":"` + att + `"}]}`, 400, "bad_request"},
		{"101 keys", many(idemadmin.MaxBulkKeys + 1), 413, "too_large"},
		{"10000 keys", many(10000), 413, "too_large"},
		{"not JSON", `release all`, 400, "bad_request"},
	} {
		a := f.api("POST", "/api/v1/keys/bulk", opsToken, tc.body)
		if a.status != tc.status || a.code(t) != tc.code {
			t.Errorf("%s: %d %s", tc.what, a.status, a.body)
		}
	}
	if got := f.retry(k).Outcome; got != idem.NeedsReview {
		t.Fatalf("after refused requests the key is %v", got)
	}

	// Keys wrong one by one: skipped, the rest settled, a duplicate once.
	other := key("order-2")
	oid := f.review(other)
	id3, id4 := f.review(key("order-3")), f.review(key("order-4"))
	body, _ := json.Marshal(map[string]any{"action": "release", "keys": []idemadmin.BulkKey{
		{ID: id, Attempt: "*"},
		{ID: "%%%", Attempt: att},
		{ID: id3, Attempt: "nothex"},
		{ID: id4, Attempt: ""},
		{ID: oid, Attempt: f.attempt(other)},
		{ID: oid, Attempt: f.attempt(other)},
	}})
	a := f.api("POST", "/api/v1/keys/bulk", opsToken, string(body))
	wantStatus(t, "keys wrong one by one", a, 200)
	var res idemadmin.BulkResult
	a.decode(t, &res)
	var got []string
	for _, it := range res.Results {
		got = append(got, it.Outcome)
	}
	if strings.Join(got, " ") != "bad_request bad_request bad_request attempt_required settled duplicate" || res.Settled != 1 || res.Skipped != 5 {
		t.Fatalf("the outcomes: %v", got)
	}
	for _, k := range []idem.Key{k, key("order-3"), key("order-4")} {
		if got := f.retry(k).Outcome; got != idem.NeedsReview {
			t.Fatalf("a key named with * or a bad attempt is %v, want needs_review", got)
		}
	}

	// A short ID names a key as its ID does: the same key named both ways
	// settles once.
	k5 := key("order-5")
	id5 := f.review(k5)
	body, _ = json.Marshal(map[string]any{"action": "release", "keys": []idemadmin.BulkKey{
		{ID: idemadmin.ShortID(k5), Attempt: f.attempt(k5)}, {ID: id5, Attempt: f.attempt(k5)}}})
	a = f.api("POST", "/api/v1/keys/bulk", opsToken, string(body))
	wantStatus(t, "short IDs", a, 200)
	res = idemadmin.BulkResult{}
	a.decode(t, &res)
	if got := outcomes(res); got != "order-5=settled order-5=duplicate" {
		t.Fatalf("a short ID and its ID: %s", got)
	}

	// The endpoint takes the Bearer token only: a signed-in browser's
	// cookie (what a forged cross-site form would carry) is refused.
	b := f.browser()
	b.signIn(opsToken)
	req, _ := http.NewRequest("POST", f.srv.URL+"/api/v1/keys/bulk", strings.NewReader(f.bulkBody("release", nil, k)))
	req.Header.Set("Content-Type", "text/plain")
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the bulk API with a session cookie: %d", resp.StatusCode)
	}
	if got := f.retry(k).Outcome; got != idem.NeedsReview {
		t.Fatalf("after a cookie-authorized bulk the key is %v", got)
	}
}

// downStore answers ErrUnavailable to the Nth Resolve.
type downStore struct {
	idemstore.Store
	calls, failAt atomic.Int32
}

func (s *downStore) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	if s.calls.Add(1) == s.failAt.Load() {
		return fmt.Errorf("%w: connection refused", idemstore.ErrUnavailable)
	}
	return s.Store.Resolve(ctx, p)
}

// TestBulkStopsWhenTheStoreIsDown: after a key the store could not
// reach, the rest are not attempted (each would wait for the store), and
// say so.
func TestBulkStopsWhenTheStoreIsDown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ds := &downStore{Store: f.store}
	ds.failAt.Store(2)
	keys := &idemadmin.Keys{Store: ds, Logger: slog.New(slog.DiscardHandler)}
	var req idemadmin.BulkRequest
	req.Action = idemadmin.ActionRelease
	for _, n := range []string{"a", "b", "c"} {
		f.review(key(n))
		req.Keys = append(req.Keys, idemadmin.BulkKey{ID: idemadmin.KeyID(key(n)), Attempt: f.attempt(key(n))})
	}
	res, err := keys.Bulk(context.Background(), "ops", req)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(res); got != "a=settled b=store_unavailable c=not_attempted" {
		t.Fatalf("the result: %s", got)
	}
	if got := f.retry(key("c")).Outcome; got != idem.NeedsReview {
		t.Fatalf("the key not attempted is %v", got)
	}
	// A caller gone before the first key: nothing is attempted after it.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req.Keys = req.Keys[1:]
	ds.failAt.Store(0)
	res, err = keys.Bulk(ctx, "ops", req)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(res); got != "b=settled c=not_attempted" {
		t.Fatalf("with the caller gone: %s", got)
	}
}
