package idemadmin_test

// Attacks on the admin API and the review page, as a hostile reviewer
// would make them: markup and escapes stored by hostile requests and
// upstreams, planted session cookies, forged and oversized ids, a cookie
// that loses Secure behind the TLS-terminating proxy the docs recommend,
// and changes to keys that are not in review. Tests skipped with
// "finding N: …" failed against the code when they were written.

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// hostile is markup that must never reach a page unescaped: visible ASCII,
// so that it is also a valid Idempotency-Key.
const hostile = `"><script>alert(1)</script><img/src=x/onerror=alert(2)>`

// pageScript is the one script tag a page may hold: its own file.
const pageScript = `<script src="/static/admin.js" defer></script>`

// wantSafePage checks that a page carries the security headers and no
// markup of hostile's unescaped.
func wantSafePage(t *testing.T, what string, p page) {
	t.Helper()
	// The page's own script, from its own file, is the one script allowed.
	body := strings.ReplaceAll(p.body, pageScript, "")
	for _, bad := range []string{"<script", "<img", "\x1b", "\x07", "\u202e"} {
		if strings.Contains(body, bad) {
			t.Errorf("%s (%d) holds %q unescaped:\n%s", what, p.status, bad, p.body)
		}
	}
	for name, want := range map[string]string{
		"Content-Security-Policy": "frame-ancestors 'none'",
		"X-Frame-Options":         "DENY",
		"X-Content-Type-Options":  "nosniff",
		"Cache-Control":           "no-store",
	} {
		if !strings.Contains(p.header.Get(name), want) {
			t.Errorf("%s (%d): %s = %q, want %q", what, p.status, name, p.header.Get(name), want)
		}
	}
	if !strings.Contains(p.header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("%s: the CSP %q does not forbid scripts", what, p.header.Get("Content-Security-Policy"))
	}
}

// TestAttackPageHostileEverywhere: a completed key whose stored answer
// (headers and body) came from a hostile upstream, a key in review whose
// path carries markup and terminal escapes, hostile form fields echoed on
// the confirmation pages, and hostile query strings and paths: every page,
// signed in or not, escapes all of it and carries the security headers.
func TestAttackPageHostileEverywhere(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	done := idem.Key{Scope: "s" + hostile, Operation: "POST /pay" + hostile, Key: "k" + hostile}
	resp := &idem.Response{Status: 201, Header: http.Header{
		"X-Evil":       {hostile + "\x1b[2J"},
		"Content-Type": {"text/html"},
	}, Body: []byte("</pre>" + hostile + "\u202e")}
	if err := f.begin(done, &idemstore.Request{Method: "POST", Path: "/pay" + hostile, Query: "q=" + hostile, Body: []byte(hostile)}).Complete(context.Background(), resp); err != nil {
		t.Fatal(err)
	}
	inReview := idem.Key{Scope: "tenant-1", Operation: "POST /pay\x1b]0;owned\x07" + hostile, Key: "r" + hostile}
	if err := f.begin(inReview, &idemstore.Request{Method: "POST", Path: "/pay\x1b]0;owned\x07" + hostile, Body: []byte("\xff\xfe" + hostile)}).
		Escalate(context.Background(), "reset"+hostile+"\u202e"); err != nil {
		t.Fatal(err)
	}
	doneID, reviewID := idemadmin.KeyID(done), idemadmin.KeyID(inReview)

	anon := f.browser()
	wantSafePage(t, "the login page", anon.get("/login"))
	wantSafePage(t, "a missing page, signed out", anon.get("/nosuch/"+url.PathEscape(hostile)))
	wantSafePage(t, "a refused sign-in", anon.do("POST", "/login", url.Values{"token": {hostile}}))

	b := f.browser()
	b.signIn(opsToken)
	for _, path := range []string{
		"/", "/?state=completed", "/?state=pending", "/?state=" + url.QueryEscape(hostile), "/?cursor=" + url.QueryEscape(hostile),
		"/keys/" + doneID, "/keys/" + reviewID, "/keys/" + url.PathEscape(hostile), "/nosuch/" + url.PathEscape(hostile),
	} {
		wantSafePage(t, "GET "+path, b.get(path))
	}
	p := b.get("/keys/" + doneID)
	wantPage(t, "the completed key", p, 200, "&lt;script&gt;", `<span class="esc">\x1b</span>[2J`)
	doneAt, reviewAt := f.attempt(done), f.attempt(inReview)
	wantSafePage(t, "the resolve confirmation", b.post("/keys/"+reviewID+"/resolve", url.Values{
		"action": {"complete"}, "status": {"201"}, "headers": {"X-Evil: " + hostile + "\nContent-Type: text/html"},
		"body": {"</textarea>" + hostile}, "note": {hostile}, "attempt": {reviewAt},
	}))
	wantSafePage(t, "a refused resolution", b.post("/keys/"+reviewID+"/resolve", url.Values{
		"action": {"complete"}, "status": {hostile}, "headers": {hostile}, "body": {hostile}, "note": {hostile}, "attempt": {reviewAt},
	}))
	wantSafePage(t, "a hostile attempt", b.post("/keys/"+reviewID+"/resolve", url.Values{
		"action": {"release"}, "note": {hostile}, "attempt": {hostile}, "confirm": {"yes"},
	}))
	wantSafePage(t, "the delete confirmation", b.post("/keys/"+doneID+"/delete", url.Values{"note": {hostile}, "attempt": {doneAt}}))
	wantSafePage(t, "a refused form token", b.post("/keys/"+doneID+"/delete", url.Values{"csrf": {hostile}, "note": {hostile}, "attempt": {doneAt}}))
	wantSafePage(t, "a hostile attempt to delete", b.post("/keys/"+doneID+"/delete", url.Values{"note": {hostile}, "attempt": {hostile}}))

	// Completing it with hostile headers and body, then showing it.
	p = b.post("/keys/"+reviewID+"/resolve", url.Values{"action": {"complete"}, "status": {"201"},
		"headers": {"X-Evil: " + hostile}, "body": {hostile}, "note": {hostile}, "confirm": {"yes"}, "attempt": {reviewAt}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("completing the key: %d %s", p.status, p.body)
	}
	wantSafePage(t, "the key completed by the page", b.get(p.header.Get("Location")))
	wantSafePage(t, "the queue with the flash", b.get("/?state=completed"))
}

// TestAttackPlantedSessionCookie: a session ID planted in the browser
// before sign-in (session fixation) is never adopted: signing in issues a
// new random ID, and the planted one opens nothing, before or after.
func TestAttackPlantedSessionCookie(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.review(key("order-1"))
	b := f.browser()
	planted := "planted-session-id-0123456789abcdef"
	u, _ := url.Parse(f.srv.URL)
	b.c.Jar.SetCookies(u, []*http.Cookie{{Name: "idem_admin_session", Value: planted, Path: "/"}})
	if p := b.get("/"); p.status != http.StatusSeeOther {
		t.Fatalf("a planted cookie opened the queue: %d", p.status)
	}
	p := b.do("POST", "/login", url.Values{"token": {opsToken}})
	cookie := p.header.Get("Set-Cookie")
	if p.status != http.StatusSeeOther || !strings.HasPrefix(cookie, "idem_admin_session=") || strings.Contains(cookie, planted) {
		t.Fatalf("sign-in with a planted cookie: %d, Set-Cookie %q", p.status, cookie)
	}
	attacker := f.browser()
	attacker.c.Jar.SetCookies(u, []*http.Cookie{{Name: "idem_admin_session", Value: planted, Path: "/"}})
	if p := attacker.get("/keys/" + idemadmin.KeyID(key("order-1"))); p.status != http.StatusSeeOther {
		t.Fatalf("the planted ID opens a key page after the victim signed in: %d", p.status)
	}
	// The victim's session is not an API credential either.
	victimCookie := strings.TrimPrefix(strings.SplitN(cookie, ";", 2)[0], "idem_admin_session=")
	req, _ := http.NewRequest("GET", f.srv.URL+"/api/v1/keys", nil)
	req.AddCookie(&http.Cookie{Name: "idem_admin_session", Value: victimCookie})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the API with a session cookie and no token: %d, want 401", resp.StatusCode)
	}
}

// TestAttackSignInRedirects: signing in always lands on the queue of
// this listener, whatever the query, the Referer or the Host say: no
// parameter turns the sign-in into an open redirect.
func TestAttackSignInRedirects(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, q := range []string{"?next=//evil.example/", "?redirect=https://evil.example", "?return_to=%2F%2Fevil.example", "?continue=/\\evil.example"} {
		b := f.browser()
		p := b.do("POST", "/login"+q, url.Values{"token": {opsToken}, "next": {"//evil.example/"}}, "Referer", "https://evil.example/")
		if p.status != http.StatusSeeOther || p.header.Get("Location") != "/" {
			t.Errorf("sign-in with %s: %d, Location %q; want 303 to /", q, p.status, p.header.Get("Location"))
		}
		if p := b.get("/login" + q); p.status != http.StatusSeeOther || p.header.Get("Location") != "/" {
			t.Errorf("the sign-in page when signed in, with %s: %d, Location %q", q, p.status, p.header.Get("Location"))
		}
	}
	req, _ := http.NewRequest("POST", f.srv.URL+"/login", strings.NewReader(url.Values{"token": {opsToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Host = "evil.example"
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode == http.StatusSeeOther && loc != "/" {
		t.Errorf("sign-in with Host evil.example redirects to %q", loc)
	}
}

// TestAttackSecureCookieBehindTLSTerminator: docs/admin-api.md advises a
// TLS-terminating proxy in front of the admin listener. The browser then
// speaks HTTPS, and the session cookie must be Secure, or a plain-HTTP
// request to the same host (a typed URL, a port-80 redirector) carries it
// in clear. The terminator says so with X-Forwarded-Proto: https.
func TestAttackSecureCookieBehindTLSTerminator(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.browser()
	p := b.do("POST", "/login", url.Values{"token": {opsToken}}, "X-Forwarded-Proto", "https", "Sec-Fetch-Site", "same-origin")
	if p.status != http.StatusSeeOther {
		t.Fatalf("sign in: %d %s", p.status, p.body)
	}
	if cookie := p.header.Get("Set-Cookie"); !regexp.MustCompile(`(?i);\s*Secure\b`).MatchString(cookie) {
		t.Fatalf("the session cookie set for an HTTPS browser behind a TLS terminator is not Secure: %q", cookie)
	}
}

// TestAttackForgedIDs: ids that are not ours (garbage, empty parts, huge,
// another encoding of a real key's id, a slash smuggled in) are refused
// with 400 or 404, never 500, by the API and by the page, and change
// nothing.
func TestAttackForgedIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("order-1"))
	huge := idemadmin.KeyID(idemstore.Key{Scope: strings.Repeat("s", 64<<10), Operation: "POST /x", Key: strings.Repeat("k", 64<<10)})
	for _, forged := range []string{
		"%21%21", "AAAA", idemadmin.KeyID(idemstore.Key{Scope: "tenant-1", Operation: "POST /payments"}), // no key
		huge, id + "A", id + "%2F..%2F" + id, url.PathEscape(hostile), strings.Repeat("A", 100<<10),
	} {
		short := forged[:min(len(forged), 40)]
		for _, call := range []struct{ method, path, body string }{
			{"GET", "/api/v1/keys/" + forged, ""},
			{"POST", "/api/v1/keys/" + forged + "/resolve", `{"action":"release","attempt":"*"}`},
			{"DELETE", "/api/v1/keys/" + forged, `{"attempt":"*"}`},
		} {
			a := f.api(call.method, call.path, opsToken, call.body)
			if a.status != http.StatusBadRequest && a.status != http.StatusNotFound {
				t.Errorf("%s %s…: %d %s", call.method, short, a.status, a.body[:min(len(a.body), 300)])
			}
		}
	}
	b := f.browser()
	b.signIn(opsToken)
	for _, forged := range []string{"%21%21", huge, url.PathEscape(hostile)} {
		p := b.get("/keys/" + forged)
		if p.status != http.StatusBadRequest && p.status != http.StatusNotFound {
			t.Errorf("the page of a forged id: %d", p.status)
		}
		wantSafePage(t, "the page of a forged id", p)
	}
	if got := f.retry(key("order-1")).Outcome; got != idem.NeedsReview {
		t.Fatalf("after forged ids the key is %v, want needs_review", got)
	}
}

// TestAttackSettlingAKeyInFlight: a key whose holder is still at work
// cannot be resolved or deleted, through the API or the page; the
// holder's answer is stored afterwards, untouched, and a completed key's
// resolution is refused without touching its answer.
func TestAttackSettlingAKeyInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := key("in-flight")
	lease := f.begin(k, nil)
	id := idemadmin.KeyID(k)
	at := f.attempt(k)
	for _, attempt := range []string{"*", at} {
		for _, body := range []string{`{"action":"release","attempt":"` + attempt + `"}`, `{"action":"complete","status":201,"body":"forged","attempt":"` + attempt + `"}`} {
			a := f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, body)
			if a.status != http.StatusConflict || a.code(t) != "not_needs_review" {
				t.Fatalf("resolving a pending key with %s: %d %s", body, a.status, a.body)
			}
		}
		if a := f.api("DELETE", "/api/v1/keys/"+id, opsToken, `{"attempt":"`+attempt+`"}`); a.status != http.StatusConflict || a.code(t) != "not_completed" {
			t.Fatalf("deleting a pending key: %d %s", a.status, a.body)
		}
	}
	b := f.browser()
	b.signIn(opsToken)
	b.get("/keys/" + id)
	// Forms forged with the holder's attempt (the page shows none).
	wantPage(t, "releasing a pending key on the page", b.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}, "attempt": {at}}), 409, "Not changed")
	wantPage(t, "deleting a pending key on the page", b.post("/keys/"+id+"/delete", url.Values{"confirm": {"yes"}, "attempt": {at}}), 409, "Not changed")

	if err := lease.Complete(context.Background(), &idem.Response{Status: 201, Body: []byte("the holder's answer")}); err != nil {
		t.Fatalf("the holder's Complete after refused changes: %v", err)
	}
	r := f.retry(k)
	if r.Outcome != idem.Replayed || string(r.Response.Body) != "the holder's answer" {
		t.Fatalf("the retry: %v %q", r.Outcome, r.Response.Body)
	}
	a := f.api("POST", "/api/v1/keys/"+id+"/resolve", opsToken, `{"action":"complete","status":200,"body":"forged","attempt":"*"}`)
	if a.status != http.StatusConflict {
		t.Fatalf("completing a completed key: %d %s", a.status, a.body)
	}
	if r := f.retry(k); string(r.Response.Body) != "the holder's answer" {
		t.Fatalf("the answer changed to %q", r.Response.Body)
	}
}
