package idemadmin_test

// The review page's overview, search, bulk actions and readable bodies,
// over HTTP.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// reviewLabelled puts k in review with a scope label, through the store.
func (f *fixture) reviewLabelled(k idem.Key, label string, info *idemstore.Request) string {
	f.t.Helper()
	ctx := context.Background()
	if _, _, err := f.store.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok-" + k.Key, Lease: time.Minute,
		Request: info, ScopeLabel: label}); err != nil {
		f.t.Fatal(err)
	}
	if err := f.store.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok-" + k.Key, Reason: "upstream failed: connection reset"}); err != nil {
		f.t.Fatal(err)
	}
	return idemadmin.KeyID(k)
}

// selection is the queue's box value of k.
func (f *fixture) selection(k idem.Key) string { return idemadmin.KeyID(k) + ":" + f.attempt(k) }

// TestPageOverview: the review queue opens on the counts per state, the
// key waiting longest and its age, the open keys per operation, and the
// latest admin actions, in regions the page refreshes.
func TestPageOverview(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.review(key("order-1"))
	f.review(idem.Key{Scope: "tenant-1", Operation: "POST /refunds", Key: "refund-9"})
	f.review(key("order-2"))
	f.begin(key("in-flight"), nil)
	f.complete(key("done"))
	b := f.browser()
	b.signIn(opsToken)
	p := b.get("/")
	wantPage(t, "the overview", p, 200, `data-live="overview"`, `data-live="queue"`, `id="live-status"`,
		`<span class="n">3</span> need review`, `<span class="n">1</span> in flight`, `<span class="n">1</span> completed`,
		"the oldest in review: <code>order-1</code>", "POST /payments?currency=eur",
		"<code>POST /payments</code></a></td><td class=\"num\">2</td><td class=\"num\">1</td>",
		"<code>POST /refunds</code></a></td><td class=\"num\">1</td><td class=\"num\">0</td>",
		"None since this server started", ", the oldest first")
	// Actions made here show, newest first, with who.
	wantStatus(t, "release", f.api("POST", "/api/v1/keys/"+idemadmin.KeyID(key("order-2"))+"/resolve", aliceToken, `{"action":"release","attempt":"*","note":"no charge"}`), 200)
	p = b.get("/")
	wantPage(t, "the overview after a release", p, 200, "<strong>alice</strong> released", "<code>order-2</code>", "no charge", `<span class="n">2</span> need review`)
	// The operation links to its keys in review.
	wantPage(t, "the keys of an operation", b.get("/?"+url.Values{"state": {"needs_review"}, "operation": {"POST /refunds"}}.Encode()), 200, "refund-9")
	if strings.Contains(b.get("/?"+url.Values{"state": {"needs_review"}, "operation": {"POST /refunds"}}.Encode()).body, "order-1") {
		t.Error("the keys of POST /refunds list order-1")
	}
}

// TestPageSearch: a key is found by its value in every scope and state,
// by prefix, and with filters; what was searched for comes back escaped.
func TestPageSearch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.review(idem.Key{Scope: "tenant-1", Operation: "POST /payments", Key: "order-1001"})
	f.complete(idem.Key{Scope: "tenant-2", Operation: "POST /payments", Key: "order-1001"})
	f.review(idem.Key{Scope: "tenant-3", Operation: "POST /payments", Key: "order-1002"})
	f.reviewLabelled(idem.Key{Scope: "tenant-4", Operation: "POST /payments", Key: "order-77"}, `acct_42<b>x</b>`, nil)
	b := f.browser()
	b.signIn(opsToken)
	find := func(v url.Values) page { return b.get("/?" + v.Encode()) }
	p := find(url.Values{"find": {"order-1001"}})
	wantPage(t, "search by key", p, 200, "Search results", "tenant-1", "tenant-2", "completed")
	if strings.Contains(p.body, "order-1002") || strings.Contains(p.body, `data-live="overview"`) {
		t.Errorf("the exact search shows another key or the overview:\n%s", p.body)
	}
	wantPage(t, "search by prefix", find(url.Values{"find": {"order-100"}, "match": {"prefix"}}), 200, "order-1001", "order-1002")
	p = find(url.Values{"find": {"order-100"}, "match": {"prefix"}, "state": {"needs_review"}})
	wantPage(t, "prefix in review", p, 200, "order-1002", `name="k"`)
	if strings.Contains(p.body, "tenant-2") {
		t.Error("a search in review shows the completed key")
	}
	wantPage(t, "by label", find(url.Values{"label": {`acct_42<b>x</b>`}}), 200, "order-77", "acct_42&lt;b&gt;x&lt;/b&gt;")
	wantPage(t, "by reason", find(url.Values{"reason": {"CONNECTION RESET"}, "state": {"any"}}), 200, "order-77")
	wantPage(t, "older than", find(url.Values{"find": {"order-1001"}, "older_than": {"1d"}}), 200, "No key matches")
	p = find(url.Values{"find": {`"><script>alert(1)</script>`}})
	wantSafePage(t, "a hostile search", p)
	wantPage(t, "a hostile search", p, 200, "No key matches", `value="&#34;&gt;&lt;script&gt;`)
	wantPage(t, "a bad age", find(url.Values{"find": {"x"}, "older_than": {"soon"}}), 400, "The search did not run", "older_than")
	wantPage(t, "the queue shows short IDs and labels", b.get("/"), 200, "order-1001~", `<span class="label">acct_42&lt;b&gt;x&lt;/b&gt;</span>`)
}

// TestPageBulkRelease: keys ticked on the queue are listed, each with its
// request, on a confirmation; confirmed, each is released.
func TestPageBulkRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ks := []idem.Key{key("order-1"), key("order-2"), key("order-3")}
	for _, k := range ks {
		f.review(k)
	}
	f.review(key("not-ticked"))
	b := f.browser()
	b.signIn(opsToken)
	sel := url.Values{"action": {"release"}, "attempt": nil}
	for _, k := range ks {
		sel.Add("k", f.selection(k))
	}
	delete(sel, "attempt")
	p := b.post("/bulk", cloneValues(sel))
	wantPage(t, "the confirmation", p, 200, "Confirm: release these 3 keys?", "order-1", "order-2", "order-3", "POST /payments?currency=eur", "Release 3 keys", `name="confirm" value="yes"`)
	if strings.Contains(p.body, "not-ticked") {
		t.Error("the confirmation lists a key not ticked")
	}
	for _, k := range ks {
		if got := f.retry(k).Outcome; got != idem.NeedsReview {
			t.Fatalf("before the confirmation %s is %v", k.Key, got)
		}
	}
	conf := cloneValues(sel)
	conf.Set("confirm", "yes")
	conf.Set("note", "provider has none")
	p = b.post("/bulk", conf)
	wantPage(t, "the result", p, 200, "Released 3 of 3 keys", "Every key was settled")
	for _, k := range ks {
		if got := f.retry(k).Outcome; got != idem.Acquired {
			t.Errorf("after the bulk release %s is %v", k.Key, got)
		}
	}
	if got := f.retry(key("not-ticked")).Outcome; got != idem.NeedsReview {
		t.Errorf("the key not ticked is %v", got)
	}
	if n := strings.Count(f.log.String(), `msg="admin: key resolved" by=ops action=release`); n != 3 {
		t.Errorf("%d audit lines", n)
	}
}

func cloneValues(v url.Values) url.Values {
	c := url.Values{}
	for k, vs := range v {
		c[k] = append([]string(nil), vs...)
	}
	c["attempt"] = nil // the bulk form sends attempts in k
	delete(c, "attempt")
	return c
}

// TestPageBulkCompleteOneChanged: the answer is asked for, then shown
// with every key; one key changes before the confirmation and another
// after it: both are skipped and reported, the others get the answer.
func TestPageBulkCompleteOneChanged(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ks := []idem.Key{key("a"), key("changed-early"), key("changed-late"), key("b")}
	for _, k := range ks {
		f.review(k)
	}
	b := f.browser()
	b.signIn(opsToken)
	sel := url.Values{"action": {"complete"}}
	for _, k := range ks {
		sel.Add("k", f.selection(k))
	}
	p := b.post("/bulk", cloneValues(sel))
	wantPage(t, "the answer form", p, 200, "Complete 4 keys with one answer", `name="status"`, "Review the answer…")
	// Meanwhile changed-early is released and its retry fails again.
	wantStatus(t, "release", f.api("POST", "/api/v1/keys/"+idemadmin.KeyID(key("changed-early"))+"/resolve", aliceToken, `{"action":"release","attempt":"*"}`), 200)
	f.review(key("changed-early"))
	ans := cloneValues(sel)
	for n, v := range map[string]string{"step": "answer", "status": "201", "headers": "Content-Type: application/json", "body": `{"charged":true}`, "note": "per dashboard"} {
		ans.Set(n, v)
	}
	p = b.post("/bulk", ans)
	wantPage(t, "the confirmation", p, 200, "store this answer for these 4 keys?", "1 of these keys changed since the list was read",
		"Will be skipped: it went to review again", "The answer every retry will get", "{&#34;charged&#34;:true}", "Complete 4 keys")
	// After the confirmation page, changed-late is settled by alice.
	wantStatus(t, "complete", f.api("POST", "/api/v1/keys/"+idemadmin.KeyID(key("changed-late"))+"/resolve", aliceToken, `{"action":"complete","attempt":"*","status":200,"body":"alice's"}`), 200)
	ans.Set("confirm", "yes")
	p = b.post("/bulk", ans)
	wantPage(t, "the result", p, 200, "Completed 2 of 4 keys", "2 keys were skipped", "skipped: stale_attempt", "skipped: not_needs_review")
	f.replays(key("a"), `{"charged":true}`)
	f.replays(key("b"), `{"charged":true}`)
	f.replays(key("changed-late"), "alice's")
	if got := f.retry(key("changed-early")).Outcome; got != idem.NeedsReview {
		t.Fatalf("the key that changed is %v", got)
	}
	// A bad answer goes back to the answer form, nothing changed.
	bad := cloneValues(sel)
	for n, v := range map[string]string{"step": "answer", "status": "2x", "confirm": "yes"} {
		bad.Set(n, v)
	}
	wantPage(t, "a bad status", b.post("/bulk", bad), 200, "Not changed", "Complete 4 keys with one answer")
}

// TestPageBulkRefuses: a bulk post without the form token or from
// another site, with too many keys, with "*" or with junk, changes
// nothing.
func TestPageBulkRefuses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := key("order-1")
	f.review(k)
	b := f.browser()
	b.signIn(opsToken)
	one := func() url.Values { return url.Values{"action": {"release"}, "confirm": {"yes"}, "k": {f.selection(k)}} }
	noCSRF := one()
	noCSRF.Set("csrf", "")
	wantPage(t, "no form token", b.do("POST", "/bulk", noCSRF), 403)
	withCSRF := one()
	withCSRF.Set("csrf", b.csrf)
	wantPage(t, "cross-site", b.do("POST", "/bulk", withCSRF, "Sec-Fetch-Site", "cross-site"), 403)
	many := one()
	for i := 0; i < idemadmin.MaxBulkKeys; i++ {
		many.Add("k", idemadmin.KeyID(key(fmt.Sprint("x", i)))+":0123456789abcdef")
	}
	wantPage(t, "101 keys", b.post("/bulk", many), 400, "at most 100")
	star := one()
	star.Set("k", idemadmin.KeyID(k)+":*")
	wantPage(t, "any attempt", b.post("/bulk", star), 400, "Not changed")
	junk := one()
	junk.Set("k", `"><script>alert(1)</script>`)
	p := b.post("/bulk", junk)
	wantSafePage(t, "junk", p)
	wantPage(t, "junk", p, 400)
	none := url.Values{"action": {"release"}, "confirm": {"yes"}}
	wantPage(t, "nothing selected", b.post("/bulk", none), 400, "no key is selected")
	del := one()
	del.Set("action", "delete")
	wantPage(t, "delete", b.post("/bulk", del), 400)
	if got := f.retry(k).Outcome; got != idem.NeedsReview {
		t.Fatalf("after refused posts the key is %v", got)
	}
	// A duplicate box posts once.
	dup := one()
	dup.Add("k", f.selection(k))
	wantPage(t, "a duplicate", b.post("/bulk", dup), 200, "Released 1 of 1 keys")
}

// TestPageReadableBodies: JSON bodies are shown indented with the raw
// body a click away, hostile ones escaped; the decision cards name the
// request; long hashes are short with the whole value in a details and a
// copy button (hidden without script).
func TestPageReadableBodies(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := key("order-1")
	body := `{"amount":100,"note":"</pre><script>alert(1)</script>","bidi":"` + "\u202e" + `","nested":{"a":[1,2]}}`
	lease := f.begin(k, &idemstore.Request{Method: "POST", Path: "/payments", Query: "currency=eur", Body: []byte(body)})
	if err := lease.Escalate(context.Background(), "reset"); err != nil {
		t.Fatal(err)
	}
	id := idemadmin.KeyID(k)
	b := f.browser()
	b.signIn(opsToken)
	p := b.get("/keys/" + id)
	wantSafePage(t, "the detail", p)
	wantPage(t, "the detail", p, 200, `<pre class="body json">{
  &#34;amount&#34;: 100,`, `&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;`, `<span class="esc">\u202e</span>`,
		`<details class="raw"><summary>Raw (`, `<p class="deciding">Key <code>order-1</code>: <code>POST /payments?currency=eur</code></p>`,
		`<details class="hash"><summary><code>fp-order-1</code>`, `data-copy="fp-order-1" hidden>Copy</button>`, "order-1~")
	// A body that is not JSON is shown as it is.
	k2 := key("order-2")
	lease = f.begin(k2, &idemstore.Request{Method: "POST", Path: "/payments", Body: []byte("{not json")})
	if err := lease.Escalate(context.Background(), "reset"); err != nil {
		t.Fatal(err)
	}
	p = b.get("/keys/" + idemadmin.KeyID(k2))
	wantPage(t, "a body that is not JSON", p, 200, `<pre class="body">{not json</pre>`)
	if strings.Contains(p.body, `class="raw"`) {
		t.Error("a body that is not JSON has a raw view")
	}
	// The stored answer of a completed key too.
	p = b.get("/keys/" + f.complete(key("done")))
	wantPage(t, "the answer", p, 200, `<pre class="body json">{
  &#34;id&#34;: &#34;pay_1&#34;
}</pre>`)
	// The confirmation repeats the request.
	b.get("/keys/" + id)
	wantPage(t, "the confirmation", b.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}}), 200,
		`<code>POST /payments?currency=eur</code>`, "attempt "+f.attempt(k))
	_ = http.StatusOK
}
