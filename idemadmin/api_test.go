package idemadmin_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
)

func TestAPIAuth(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.review(key("k1"))
	for _, tc := range []struct {
		name   string
		header http.Header
		query  string
		status int
	}{
		{"no token", nil, "", 401},
		{"wrong token", http.Header{"Authorization": {"Bearer " + opsToken + "x"}}, "", 401},
		{"token prefix", http.Header{"Authorization": {"Bearer " + opsToken[:10]}}, "", 401},
		{"basic scheme", http.Header{"Authorization": {"Basic " + opsToken}}, "", 401},
		{"token without scheme", http.Header{"Authorization": {opsToken}}, "", 401},
		{"two authorization headers", http.Header{"Authorization": {"Bearer " + opsToken, "Bearer " + opsToken}}, "", 401},
		{"token in the query string", nil, "?access_token=" + opsToken + "&token=" + opsToken, 401},
		{"token in a cookie", http.Header{"Cookie": {"idem_admin_session=" + opsToken}}, "", 401},
		{"right token", http.Header{"Authorization": {"Bearer " + opsToken}}, "", 200},
		{"scheme in lower case", http.Header{"Authorization": {"bearer " + aliceToken}}, "", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/api/v1/keys", "/api/v1/keys/" + idemadmin.KeyID(key("k1")), "/api/v1/nosuch"} {
				req, _ := http.NewRequest("GET", f.srv.URL+path+tc.query, nil)
				for k, v := range tc.header {
					req.Header[k] = v
				}
				resp, err := f.srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				want := tc.status
				if path == "/api/v1/nosuch" && want == 200 {
					want = 404
				}
				if resp.StatusCode != want {
					t.Errorf("GET %s: status %d, want %d", path, resp.StatusCode, want)
				}
				if want == 401 && resp.Header.Get("WWW-Authenticate") == "" {
					t.Errorf("GET %s: 401 without WWW-Authenticate", path)
				}
			}
		})
	}
	// Changes are refused without a token too, and change nothing.
	id := idemadmin.KeyID(key("k1"))
	wantStatus(t, "resolve without a token", f.api("POST", "/api/v1/keys/"+id+"/resolve", "", `{"action":"release"}`), 401)
	wantStatus(t, "delete without a token", f.api("DELETE", "/api/v1/keys/"+id, "", ""), 401)
	if got := f.retry(key("k1")).Outcome; got != idem.NeedsReview {
		t.Fatalf("after refused changes the key is %v, want needs_review", got)
	}
	if !strings.Contains(f.log.String(), "wrong token") {
		t.Errorf("a wrong token is not logged:\n%s", f.log)
	}
	if strings.Contains(f.log.String(), opsToken) {
		t.Errorf("the log holds a token:\n%s", f.log)
	}
}

func TestAPIListAndGet(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for i := 0; i < 5; i++ {
		f.review(key(fmt.Sprintf("review-%d", i)))
	}
	f.begin(key("pending-1"), nil)
	f.complete(key("done-1"))
	f.review(idem.Key{Scope: "tenant-1", Operation: "POST /refunds", Key: "refund-1"})

	var page idemadmin.Page
	a := f.api("GET", "/api/v1/keys?state=needs_review", opsToken, "")
	wantStatus(t, "list", a, 200)
	a.decode(t, &page)
	if len(page.Items) != 6 || page.NextCursor != "" {
		t.Fatalf("needs_review: %d items, cursor %q; want 6 and none", len(page.Items), page.NextCursor)
	}
	for _, it := range page.Items {
		if it.State != "needs_review" || it.Reason == "" || it.ID == "" || it.Fingerprint == "" || it.CreatedAt.IsZero() || it.UpdatedAt.IsZero() {
			t.Errorf("item %+v lacks a field", it)
		}
		if it.Request == nil || it.Request.Method != "POST" || it.Request.Query != "currency=eur" || it.Request.Body != nil {
			t.Errorf("item %s: request %+v; want method and query, no body in a listing", it.Key, it.Request)
		}
		if it.Age() < 0 {
			t.Errorf("item %s: negative age", it.Key)
		}
	}

	// The raw JSON has the documented names.
	var raw struct{ Items []map[string]any }
	json.Unmarshal(a.body, &raw)
	for _, name := range []string{"id", "scope", "operation", "key", "state", "created_at", "updated_at", "reason", "fingerprint"} {
		if _, ok := raw.Items[0][name]; !ok {
			t.Errorf("a listed item has no %q: %v", name, raw.Items[0])
		}
	}

	// Filters and pages.
	f.api("GET", "/api/v1/keys?state=needs_review&operation=POST+/refunds", opsToken, "").decode(t, &page)
	if len(page.Items) != 1 || page.Items[0].Key != "refund-1" {
		t.Fatalf("operation filter: %+v", page.Items)
	}
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		f.api("GET", "/api/v1/keys?state=needs_review&limit=2&cursor="+cursor, opsToken, "").decode(t, &page)
		for _, it := range page.Items {
			if seen[it.ID] {
				t.Fatalf("%s listed twice", it.Key)
			}
			seen[it.ID] = true
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(seen) != 6 {
		t.Fatalf("paging by 2 saw %d keys, want 6", len(seen))
	}
	f.api("GET", "/api/v1/keys?state=completed", opsToken, "").decode(t, &page)
	if len(page.Items) != 1 || page.Items[0].Response == nil || page.Items[0].Response.Status != 201 ||
		page.Items[0].Response.BodyBytes != len(`{"id":"pay_1"}`) || page.Items[0].Response.Headers.Get("Content-Type") != "application/json" ||
		page.Items[0].Response.Body != nil {
		t.Fatalf("completed: %+v", page.Items)
	}
	f.api("GET", "/api/v1/keys?state=pending", opsToken, "").decode(t, &page)
	if len(page.Items) != 1 || page.Items[0].LeaseUntil.IsZero() {
		t.Fatalf("pending: %+v", page.Items)
	}
	f.api("GET", "/api/v1/keys", opsToken, "").decode(t, &page)
	if len(page.Items) != 8 {
		t.Fatalf("all states: %d items, want 8", len(page.Items))
	}

	// The detail has the request body and the stored answer.
	var it idemadmin.Item
	f.api("GET", "/api/v1/keys/"+idemadmin.KeyID(key("review-0")), opsToken, "").decode(t, &it)
	if it.Request == nil || it.Request.Body == nil || *it.Request.Body != `{"amount":100}` || it.Request.Path != "/payments" {
		t.Fatalf("detail request: %+v", it.Request)
	}
	f.api("GET", "/api/v1/keys/"+idemadmin.KeyID(key("done-1")), opsToken, "").decode(t, &it)
	if it.Response == nil || it.Response.Body == nil || *it.Response.Body != `{"id":"pay_1"}` || it.ExpiresAt.IsZero() {
		t.Fatalf("detail response: %+v", it.Response)
	}

	for _, tc := range []struct{ path, code string }{
		{"/api/v1/keys?state=done", "bad_request"},
		{"/api/v1/keys?limit=0x10", "bad_request"},
		{"/api/v1/keys?limit=1001", "bad_request"},
		{"/api/v1/keys?limit=-1", "bad_request"},
		{"/api/v1/keys?cursor=!!", "bad_request"},
		{"/api/v1/keys/not-an-id!", "bad_request"},
		{"/api/v1/keys/" + idemadmin.KeyID(key("nosuch")), "not_found"},
	} {
		a := f.api("GET", tc.path, opsToken, "")
		if got := a.code(t); got != tc.code || a.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("GET %s: %d %s (%s), want code %s", tc.path, a.status, got, a.header.Get("Content-Type"), tc.code)
		}
	}
	a = f.api("GET", "/api/v1/keys/"+idemadmin.KeyID(key("nosuch")), opsToken, "")
	if !strings.Contains(string(a.body), `\"nosuch\"`) {
		t.Errorf("not found does not name the key: %s", a.body)
	}
}

func TestAPIResolveRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("k"))
	a := f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, `{"action":"release","note":"never reached the provider","attempt":"`+f.attempt(key("k"))+`"}`)
	wantStatus(t, "release", a, 200)
	var res idemadmin.Result
	a.decode(t, &res)
	if res.State != "released" || res.By != "ops" || res.Key != "k" || res.Note != "never reached the provider" {
		t.Fatalf("result %+v", res)
	}
	if got := f.retry(key("k")).Outcome; got != idem.Acquired {
		t.Fatalf("the retry after a release: %v, want acquired", got)
	}
	if ch := <-f.changes; ch.Action != "release" {
		t.Errorf("OnChange got %+v", ch)
	}
	log := f.log.String()
	for _, s := range []string{"admin: key resolved", "by=ops", "action=release", "key=k", "attempt=" + res.Attempt, "any_attempt=false", `note="never reached the provider"`} {
		if !strings.Contains(log, s) {
			t.Errorf("the audit log lacks %s:\n%s", s, log)
		}
	}
}

func TestAPIResolveComplete(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("k"))
	a := f.api("POST", "/api/v1/keys/"+id+"/resolve", aliceToken,
		`{"action":"complete","status":201,"headers":{"content-type":"application/json","X-Multi":["a","b"]},"body":"{\"charge\":\"ch_1\"}","note":"charged per the dashboard","attempt":"`+f.attempt(key("k"))+`"}`)
	wantStatus(t, "complete", a, 200)
	var res idemadmin.Result
	a.decode(t, &res)
	if res.State != "completed" || res.By != "alice" || res.Item == nil || res.Item.State != "completed" {
		t.Fatalf("result %+v", res)
	}
	for _, s := range []string{"completed with status 201 by alice", "charged per the dashboard", "was: upstream failed"} {
		if !strings.Contains(res.Item.Reason, s) {
			t.Errorf("the record's reason %q lacks %q", res.Item.Reason, s)
		}
	}
	r := f.retry(key("k"))
	if r.Outcome != idem.Replayed || r.Response.Status != 201 || string(r.Response.Body) != `{"charge":"ch_1"}` ||
		r.Response.Header.Get("Content-Type") != "application/json" || len(r.Response.Header["X-Multi"]) != 2 {
		t.Fatalf("the retry after complete: %v %+v", r.Outcome, r.Response)
	}

	// Binary bodies go in base64.
	id = f.review(key("bin"))
	wantStatus(t, "complete base64", f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, `{"action":"complete","status":200,"body_base64":"AP8=","attempt":"*"}`), 200)
	if r := f.retry(key("bin")); string(r.Response.Body) != "\x00\xff" {
		t.Fatalf("base64 body replayed as %q", r.Response.Body)
	}
	var it idemadmin.Item
	f.api("GET", "/api/v1/keys/"+id, opsToken, "").decode(t, &it)
	if it.Response.BodyBase64 != "AP8=" || it.Response.Body != nil {
		t.Fatalf("a binary body is shown as %+v", it.Response)
	}
}

func TestAPIResolveRefusesBadRequests(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("k"))
	done := f.complete(key("done"))
	for _, tc := range []struct {
		name, id, body string
		status         int
		code           string
	}{
		{"no action", id, `{}`, 400, "bad_request"},
		{"unknown action", id, `{"action":"retry"}`, 400, "bad_request"},
		{"misspelt field", id, `{"action":"release","nots":"x"}`, 400, "bad_request"},
		{"release with an answer", id, `{"action":"release","status":201}`, 400, "bad_request"},
		{"complete without status", id, `{"action":"complete"}`, 400, "bad_request"},
		{"informational status", id, `{"action":"complete","status":100}`, 400, "bad_request"},
		{"status 600", id, `{"action":"complete","status":600}`, 400, "bad_request"},
		{"Set-Cookie", id, `{"action":"complete","status":200,"headers":{"set-cookie":"s=1"}}`, 400, "bad_request"},
		{"Content-Length", id, `{"action":"complete","status":200,"headers":{"Content-Length":"3"}}`, 400, "bad_request"},
		{"CRLF in a header value", id, `{"action":"complete","status":200,"headers":{"X-A":"a\r\nSet-Cookie: s=1"}}`, 400, "bad_request"},
		{"bad header name", id, `{"action":"complete","status":200,"headers":{"X A":"a"}}`, 400, "bad_request"},
		{"header value a number", id, `{"action":"complete","status":200,"headers":{"X-A":1}}`, 400, "bad_request"},
		{"body and body_base64", id, `{"action":"complete","status":200,"body":"a","body_base64":"YQ=="}`, 400, "bad_request"},
		{"bad base64", id, `{"action":"complete","status":200,"body_base64":"!"}`, 400, "bad_request"},
		{"note too long", id, `{"action":"release","note":"` + strings.Repeat("n", 1001) + `"}`, 400, "bad_request"},
		{"two JSON values", id, `{"action":"release"}{"action":"release"}`, 400, "bad_request"},
		{"empty body", id, ``, 400, "bad_request"},
		{"not JSON", id, `action=release`, 400, "bad_request"},
		{"malformed id", "%21", `{"action":"release"}`, 400, "bad_request"},
		{"no attempt", id, `{"action":"release"}`, 428, "attempt_required"},
		{"empty attempt", id, `{"action":"release","attempt":""}`, 428, "attempt_required"},
		{"attempt too short", id, `{"action":"release","attempt":"4f1c"}`, 400, "bad_request"},
		{"attempt not hex", id, `{"action":"release","attempt":"4F1C0A9E7D2B6C35"}`, 400, "bad_request"},
		{"attempt the key id", id, `{"action":"release","attempt":"` + id + `"}`, 400, "bad_request"},
		{"attempt of nothing", id, `{"action":"release","attempt":"0000000000000000"}`, 409, "stale_attempt"},
		{"unknown key", idemadmin.KeyID(key("nosuch")), `{"action":"release","attempt":"*"}`, 404, "not_found"},
		{"completed key", done, `{"action":"release","attempt":"*"}`, 409, "not_needs_review"},
	} {
		a := f.api("POST", "/api/v1/keys/"+tc.id+"/resolve", opsToken, tc.body)
		if a.status != tc.status || a.code(t) != tc.code {
			t.Errorf("%s: %d %s, want %d %s: %s", tc.name, a.status, a.code(t), tc.status, tc.code, a.body)
		}
	}
	if got := f.retry(key("k")).Outcome; got != idem.NeedsReview {
		t.Fatalf("after refused resolutions the key is %v, want needs_review", got)
	}
	a := f.api("POST", "/api/v1/keys/"+done+"/resolve", opsToken, `{"action":"release","attempt":"*"}`)
	if !strings.Contains(string(a.body), `\"done\"`) || !strings.Contains(string(a.body), "completed") {
		t.Errorf("the conflict does not name the key and its state: %s", a.body)
	}
	big := `{"action":"complete","status":200,"body":"` + strings.Repeat("x", idemadmin.MaxAnswerBody+1) + `"}`
	if a := f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, big); a.status != 400 {
		t.Errorf("an answer over MaxAnswerBody: %d %s", a.status, a.body[:min(len(a.body), 200)])
	}
}

// TestAPIConcurrentResolve: two operators settle one key at once; one
// wins, the other is told the key was settled, and the key is settled once.
func TestAPIConcurrentResolve(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for round := 0; round < 20; round++ {
		k := key(fmt.Sprintf("race-%d", round))
		id := f.review(k)
		var wg sync.WaitGroup
		answers := make([]apiAnswer, 2)
		at := f.attempt(k)
		for i, body := range []string{`{"action":"release","attempt":"` + at + `"}`, `{"action":"complete","status":201,"body":"done","attempt":"` + at + `"}`} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, body)
			}()
		}
		wg.Wait()
		ok := 0
		for _, a := range answers {
			switch {
			case a.status == 200:
				ok++
			case a.status == 409 && a.code(t) == "not_needs_review", a.status == 404 && a.code(t) == "not_found":
			default:
				t.Fatalf("round %d: %d %s", round, a.status, a.body)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d resolutions succeeded, want 1: %s / %s", round, ok, answers[0].body, answers[1].body)
		}
		r := f.retry(k)
		if answers[0].status == 200 && r.Outcome != idem.Acquired || answers[1].status == 200 && r.Outcome != idem.Replayed {
			t.Fatalf("round %d: the retry got %v after %s / %s", round, r.Outcome, answers[0].body, answers[1].body)
		}
	}
}

func TestAPIDelete(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	done := f.complete(key("done"))
	review := f.review(key("review"))
	a := f.api("DELETE", "/api/v1/keys/"+review, opsToken, `{"attempt":"`+f.attempt(key("review"))+`"}`)
	if a.status != 409 || a.code(t) != "not_completed" {
		t.Fatalf("delete a key in review: %d %s", a.status, a.body)
	}
	a = f.api("DELETE", "/api/v1/keys/"+done, opsToken, `{"note":"customer asked to charge again"}`)
	if a.status != 428 || a.code(t) != "attempt_required" {
		t.Fatalf("delete without an attempt: %d %s", a.status, a.body)
	}
	at := f.attempt(key("done"))
	a = f.api("DELETE", "/api/v1/keys/"+done, opsToken, `{"note":"customer asked to charge again","attempt":"`+at+`"}`)
	wantStatus(t, "delete", a, 200)
	var res idemadmin.Result
	a.decode(t, &res)
	if res.State != "deleted" || res.By != "ops" || res.Note != "customer asked to charge again" || res.Attempt != at {
		t.Fatalf("result %+v", res)
	}
	wantStatus(t, "get after delete", f.api("GET", "/api/v1/keys/"+done, opsToken, ""), 404)
	if got := f.retry(key("done")).Outcome; got != idem.Acquired {
		t.Fatalf("a request after delete: %v, want acquired", got)
	}
	if !strings.Contains(f.log.String(), "admin: key deleted") {
		t.Errorf("no audit line:\n%s", f.log)
	}
	a = f.api("DELETE", "/api/v1/keys/"+done+"?note=again&attempt=*", opsToken, "")
	if a.status != 409 || a.code(t) != "not_completed" {
		t.Fatalf("delete a key someone else just took: %d %s", a.status, a.body)
	}
}

func TestClient(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("k"))
	f.complete(key("done"))
	c, err := idemadmin.NewClient(f.srv.URL+"/", opsToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	page, err := c.List(ctx, idemadmin.ListQuery{State: "needs_review"})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != id {
		t.Fatalf("List: %+v, %v", page, err)
	}
	it, err := c.Get(ctx, id)
	if err != nil || it.Request == nil || it.Request.Body == nil {
		t.Fatalf("Get: %+v, %v", it, err)
	}
	res, err := c.Resolve(ctx, id, idemadmin.ResolveRequest{Action: "release", Note: "n", Attempt: f.attempt(key("k"))})
	if err != nil || res.State != "released" {
		t.Fatalf("Resolve: %+v, %v", res, err)
	}
	_, err = c.Resolve(ctx, id, idemadmin.ResolveRequest{Action: "release", Attempt: idemadmin.AnyAttempt})
	var ae *idemadmin.Error
	if !errAs(err, &ae) || ae.Code != idemadmin.CodeNotFound || ae.Status != 404 {
		t.Fatalf("Resolve again: %v", err)
	}
	if res, err = c.Delete(ctx, idemadmin.KeyID(key("done")), idemadmin.DeleteRequest{Note: "gone", Attempt: f.attempt(key("done"))}); err != nil || res.State != "deleted" {
		t.Fatalf("Delete: %+v, %v", res, err)
	}
	bad, _ := idemadmin.NewClient(f.srv.URL, "wrong-token-0123456789", nil)
	if _, err := bad.List(ctx, idemadmin.ListQuery{}); !errAs(err, &ae) || ae.Code != idemadmin.CodeUnauthorized {
		t.Fatalf("List with a wrong token: %v", err)
	}
	for _, u := range []string{"", "127.0.0.1:9090", "ftp://x", "http://"} {
		if _, err := idemadmin.NewClient(u, opsToken, nil); err == nil {
			t.Errorf("NewClient(%q) accepted", u)
		}
	}
	if _, err := idemadmin.NewClient(f.srv.URL, "", nil); err == nil {
		t.Error("NewClient without a token accepted")
	}
}

// TestAPIStaleAttempt: a resolution that names the attempt it looked at
// never settles a later attempt that went to review since.
func TestAPIStaleAttempt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("k"))
	var first idemadmin.Item
	f.api("GET", "/api/v1/keys/"+id, opsToken, "").decode(t, &first)
	if first.Attempt == "" || strings.Contains(string(f.api("GET", "/api/v1/keys/"+id, opsToken, "").body), "token") {
		t.Fatalf("attempt %q", first.Attempt)
	}
	// Someone releases it; the client's retry fails the same way.
	wantStatus(t, "release", f.api("POST", "/api/v1/keys/"+id+"/resolve", aliceToken, `{"action":"release","attempt":"`+first.Attempt+`"}`), 200)
	f.review(key("k"))
	for _, action := range []string{`"action":"complete","status":201`, `"action":"release"`} {
		a := f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, `{`+action+`,"attempt":"`+first.Attempt+`"}`)
		if a.status != 409 || a.code(t) != "stale_attempt" {
			t.Fatalf("%s of the first attempt: %d %s", action, a.status, a.body)
		}
	}
	a := f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, `{"action":"complete","status":201,"attempt":"`+first.Attempt+`"}`)
	if a.status != 409 || a.code(t) != "stale_attempt" {
		t.Fatalf("a resolution of the first attempt: %d %s", a.status, a.body)
	}
	if got := f.retry(key("k")).Outcome; got != idem.NeedsReview {
		t.Fatalf("the second attempt is %v, want needs_review", got)
	}
	var second idemadmin.Item
	f.api("GET", "/api/v1/keys/"+id, opsToken, "").decode(t, &second)
	if second.Attempt == first.Attempt {
		t.Fatal("two attempts share an attempt id")
	}
	wantStatus(t, "a resolution of the second attempt", f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, `{"action":"release","attempt":"`+second.Attempt+`"}`), 200)
}
