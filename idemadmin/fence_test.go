package idemadmin_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// answerAgain completes k once more, as the client's next request does
// after its answer was deleted, with body, and returns the new attempt.
func (f *fixture) answerAgain(k idem.Key, body string) string {
	f.t.Helper()
	if err := f.begin(k, nil).Complete(context.Background(), &idem.Response{Status: 201, Body: []byte(body)}); err != nil {
		f.t.Fatal(err)
	}
	return f.attempt(k)
}

// replays requires the client's retry of k to replay body.
func (f *fixture) replays(k idem.Key, body string) {
	f.t.Helper()
	if r := f.retry(k); r.Outcome != idem.Replayed || string(r.Response.Body) != body {
		f.t.Fatalf("the retry of %v: %v %+v; want the answer %q replayed", k, r.Outcome, r.Response, body)
	}
}

// TestAPIDeleteTwoOperators: two operators look at one answer; the first
// deletes it and the client's next request stores a new one; the second
// operator's deletion, of the answer they looked at, leaves the new
// answer alone, so the operation does not run a third time.
func TestAPIDeleteTwoOperators(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := key("order-1")
	id := f.complete(k)
	var seen idemadmin.Item
	f.api("GET", "/api/v1/keys/"+id, aliceToken, "").decode(t, &seen)
	if seen.Attempt == "" || seen.Attempt != f.attempt(k) {
		t.Fatalf("a completed key shows the attempt %q", seen.Attempt)
	}
	wantStatus(t, "the first operator's delete", f.api("DELETE", "/api/v1/keys/"+id, opsToken, `{"attempt":"`+seen.Attempt+`"}`), 200)
	second := f.answerAgain(k, "second run")
	if second == seen.Attempt {
		t.Fatal("two answers share an attempt")
	}
	for _, call := range []struct{ path, body string }{
		{"/api/v1/keys/" + id, `{"note":"stale page","attempt":"` + seen.Attempt + `"}`},
		{"/api/v1/keys/" + id + "?attempt=" + seen.Attempt, ""},
	} {
		a := f.api("DELETE", call.path, aliceToken, call.body)
		if a.status != http.StatusConflict || a.code(t) != idemadmin.CodeStaleAttempt || !strings.Contains(string(a.body), "another answer") {
			t.Fatalf("the second operator's delete of the answer they saw: %d %s", a.status, a.body)
		}
	}
	f.replays(k, "second run")
	// Looking again, the second operator may delete the new answer.
	wantStatus(t, "a delete of the answer looked at", f.api("DELETE", "/api/v1/keys/"+id, aliceToken, `{"attempt":"`+second+`"}`), 200)
	// The next request runs (begin requires it acquired). AnyAttempt
	// deletes whatever answer is there, and the log says so.
	f.answerAgain(k, "third run")
	wantStatus(t, "a delete of any attempt", f.api("DELETE", "/api/v1/keys/"+id+"?attempt=*", opsToken, ""), 200)
	if !strings.Contains(f.log.String(), "any_attempt=true") {
		t.Errorf("the audit log does not say the delete named no attempt:\n%s", f.log)
	}
}

// TestPageDeleteTwoOperators: the same on the review page: a stale page's
// deletion is refused at its confirmation and at the confirmed post.
func TestPageDeleteTwoOperators(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := key("order-1")
	id := f.complete(k)
	first := f.attempt(k)
	ops, alice := f.browser(), f.browser()
	ops.signIn(opsToken)
	alice.signIn(aliceToken)
	wantPage(t, "ops's page", ops.get("/keys/"+id), 200, `name="attempt" value="`+first+`"`, "Delete…")
	alice.get("/keys/" + id)
	wantPage(t, "ops's confirmation", ops.post("/keys/"+id+"/delete", url.Values{"note": {"charge again"}}), 200, "delete this key?", `name="attempt" value="`+first+`"`)
	if p := ops.post("/keys/"+id+"/delete", url.Values{"note": {"charge again"}, "confirm": {"yes"}}); p.status != http.StatusSeeOther {
		t.Fatalf("ops's confirmed delete: %d %s", p.status, p.body)
	}
	f.answerAgain(k, "second run")
	p := alice.post("/keys/"+id+"/delete", url.Values{"note": {"stale"}})
	wantPage(t, "alice's confirmation from a stale page", p, http.StatusConflict, "Not changed", "another answer", "Delete…")
	p = alice.post("/keys/"+id+"/delete", url.Values{"note": {"stale"}, "confirm": {"yes"}, "attempt": {first}})
	wantPage(t, "alice's confirmed delete from a stale page", p, http.StatusConflict, "Not changed", "another answer")
	f.replays(k, "second run")
}

// TestPageRefusesUnfencedChanges: a form of the review page that names no
// attempt, or any attempt, changes nothing: the page is always fenced.
func TestPageRefusesUnfencedChanges(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	review, done := key("review"), key("done")
	reviewID, doneID := f.review(review), f.complete(done)
	b := f.browser()
	b.signIn(opsToken)
	for _, attempt := range []string{"", idemadmin.AnyAttempt} {
		for _, confirm := range []string{"", "yes"} {
			p := b.post("/keys/"+reviewID+"/resolve", url.Values{"action": {"release"}, "attempt": {attempt}, "confirm": {confirm}})
			wantPage(t, "a release naming attempt "+attempt, p, http.StatusBadRequest, "Not changed", "which attempt")
			p = b.post("/keys/"+doneID+"/delete", url.Values{"attempt": {attempt}, "confirm": {confirm}})
			wantPage(t, "a delete naming attempt "+attempt, p, http.StatusBadRequest, "Not changed", "which attempt")
		}
	}
	p := b.post("/keys/"+doneID+"/delete", url.Values{"attempt": {"not-an-attempt!!"}, "confirm": {"yes"}})
	wantPage(t, "a delete naming a malformed attempt", p, http.StatusBadRequest, "Not changed", "not an attempt")
	if got := f.retry(review).Outcome; got != idem.NeedsReview {
		t.Fatalf("the key in review is %v", got)
	}
	f.replays(done, `{"id":"pay_1"}`)
}

// hookStore runs a hook inside a change, after idemadmin read the record
// and before its fenced change reaches the store: what another operator,
// a resolver or the client's next request may do in that window.
type hookStore struct {
	idemstore.Store
	beforeDelete, beforeResolve func()
	retryable                   atomic.Int32 // changes to fail with ErrRetryable first
}

func (s *hookStore) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	if s.beforeDelete != nil {
		s.beforeDelete()
	}
	if s.retryable.Add(-1) >= 0 {
		return idemstore.ErrRetryable
	}
	return s.Store.Delete(ctx, p)
}

func (s *hookStore) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	if s.beforeResolve != nil {
		s.beforeResolve()
	}
	if s.retryable.Add(-1) >= 0 {
		return idemstore.ErrRetryable
	}
	return s.Store.Resolve(ctx, p)
}

// TestKeysChangeRacesTheRecord: the record changes between the read of a
// change and its write (deleted and answered again; released and in
// review again): the change, fenced by what it read, leaves the new
// record alone, whichever attempt the caller named.
func TestKeysChangeRacesTheRecord(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	hs := &hookStore{Store: f.store}
	keys := &idemadmin.Keys{Store: hs, Logger: slog.New(slog.NewTextHandler(f.log, nil))}
	ctx := t.Context()

	done := key("done")
	doneID := f.complete(done)
	for _, attempt := range []string{f.attempt(done), idemadmin.AnyAttempt} {
		hs.beforeDelete = func() {
			hs.beforeDelete = nil
			if err := f.store.Delete(ctx, idemstore.DeleteParams{Key: done}); err != nil {
				t.Error(err)
			}
			f.answerAgain(done, "answer after "+attempt)
		}
		_, err := keys.Delete(ctx, doneID, "ops", idemadmin.DeleteRequest{Attempt: attempt})
		var ae *idemadmin.Error
		if !errAs(err, &ae) || ae.Code != idemadmin.CodeStaleAttempt {
			t.Fatalf("a delete (attempt %s) whose record was answered again after the read: %v", attempt, err)
		}
		f.replays(done, "answer after "+attempt)
	}

	review := key("review")
	reviewID := f.review(review)
	seen := f.attempt(review)
	hs.beforeResolve = func() {
		hs.beforeResolve = nil
		if err := f.store.Resolve(ctx, idemstore.ResolveParams{Key: review, Action: idemstore.ResolveRelease}); err != nil {
			t.Error(err)
		}
		f.review(review)
	}
	_, err := keys.Resolve(ctx, reviewID, "ops", idemadmin.ResolveRequest{Action: idemadmin.ActionRelease, Attempt: seen})
	var ae *idemadmin.Error
	if !errAs(err, &ae) || ae.Code != idemadmin.CodeStaleAttempt {
		t.Fatalf("a release whose key went to review again after the read: %v", err)
	}
	if got := f.retry(review).Outcome; got != idem.NeedsReview {
		t.Fatalf("the new attempt is %v, want needs_review", got)
	}
}

// TestKeysChangeRetriesConflicts: a change the store aborted on a
// transient conflict changed nothing and is tried again; one that keeps
// conflicting is answered 503, not 500.
func TestKeysChangeRetriesConflicts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	hs := &hookStore{Store: f.store}
	keys := &idemadmin.Keys{Store: hs, Logger: slog.New(slog.NewTextHandler(f.log, nil))}
	ctx := t.Context()
	done := key("done")
	id := f.complete(done)
	hs.retryable.Store(100)
	_, err := keys.Delete(ctx, id, "ops", idemadmin.DeleteRequest{Attempt: f.attempt(done)})
	var ae *idemadmin.Error
	if !errAs(err, &ae) || ae.Status != http.StatusServiceUnavailable {
		t.Fatalf("a delete that keeps conflicting: %v", err)
	}
	f.replays(done, `{"id":"pay_1"}`)
	hs.retryable.Store(2)
	if _, err := keys.Delete(ctx, id, "ops", idemadmin.DeleteRequest{Attempt: f.attempt(done)}); err != nil {
		t.Fatalf("a delete that conflicted twice: %v", err)
	}
	if got := f.retry(done).Outcome; got != idem.Acquired {
		t.Fatalf("after the delete: %v", got)
	}
}
