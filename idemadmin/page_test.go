package idemadmin_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// browser is an HTTP client with a cookie jar that does not follow
// redirects, so tests see each answer.
type browser struct {
	t       *testing.T
	f       *fixture
	c       *http.Client
	csrf    string
	attempt string // the attempt the last key's page showed
}

func (f *fixture) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: f.t, f: f, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	status int
	header http.Header
	body   string
}

var (
	csrfRE    = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	attemptRE = regexp.MustCompile(`name="attempt" value="([^"]+)"`)
)

func (b *browser) do(method, path string, form url.Values, hdr ...string) page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.f.srv.URL+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	p := page{resp.StatusCode, resp.Header, string(raw)}
	if m := csrfRE.FindStringSubmatch(p.body); m != nil {
		b.csrf = m[1]
	}
	if m := attemptRE.FindStringSubmatch(p.body); m != nil {
		b.attempt = m[1]
	}
	return p
}

func (b *browser) get(path string) page { b.t.Helper(); return b.do("GET", path, nil) }

// post sends form with the CSRF token of the last page seen and, unless
// form has an attempt field, the attempt of the last key's page seen, as
// the page's forms do.
func (b *browser) post(path string, form url.Values, hdr ...string) page {
	b.t.Helper()
	if form.Get("csrf") == "" && b.csrf != "" {
		form.Set("csrf", b.csrf)
	}
	if _, ok := form["attempt"]; !ok && b.attempt != "" {
		form.Set("attempt", b.attempt)
	}
	return b.do("POST", path, form, hdr...)
}

func (b *browser) signIn(token string) {
	b.t.Helper()
	p := b.do("POST", "/login", url.Values{"token": {token}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/" {
		b.t.Fatalf("sign in: %d %s", p.status, p.body)
	}
	b.get("/") // picks up the CSRF token
}

func wantPage(t *testing.T, what string, p page, status int, contains ...string) {
	t.Helper()
	if p.status != status {
		t.Fatalf("%s: status %d, want %d:\n%s", what, p.status, status, p.body)
	}
	for _, s := range contains {
		if !strings.Contains(p.body, s) {
			t.Fatalf("%s: the page lacks %q:\n%s", what, s, p.body)
		}
	}
}

func TestPageSignIn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.review(key("order-1"))
	b := f.browser()
	p := b.get("/")
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/login" {
		t.Fatalf("the queue without a session: %d %s", p.status, p.header.Get("Location"))
	}
	wantPage(t, "login page", b.get("/login"), 200, `type="password"`, `autofocus`)
	wantPage(t, "a wrong token", b.do("POST", "/login", url.Values{"token": {opsToken + "x"}}), 401, "not an admin token of this proxy")
	p = b.do("POST", "/login", url.Values{"token": {opsToken}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("sign in: %d", p.status)
	}
	cookie := p.header.Get("Set-Cookie")
	for _, s := range []string{"idem_admin_session=", "HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(cookie, s) {
			t.Errorf("the session cookie %q lacks %s", cookie, s)
		}
	}
	if strings.Contains(cookie, opsToken) {
		t.Errorf("the session cookie holds the token: %q", cookie)
	}
	p = b.get("/")
	wantPage(t, "queue", p, 200, "order-1", "POST /payments?currency=eur", "Signed in as <strong>ops</strong>", "connection reset")
	for name, want := range map[string]string{
		"Content-Security-Policy": "default-src 'none'",
		"X-Frame-Options":         "DENY",
		"X-Content-Type-Options":  "nosniff",
		"Cache-Control":           "no-store",
	} {
		if !strings.Contains(p.header.Get(name), want) {
			t.Errorf("%s = %q, want %q", name, p.header.Get(name), want)
		}
	}
	if strings.Count(p.body, "<script") != 1 || !strings.Contains(p.body, pageScript) {
		t.Error("the page has a script of its own, not only static/admin.js")
	}
	if csp := p.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "unsafe") {
		t.Errorf("the CSP %q allows more scripts than the page's own file", csp)
	}
	wantPage(t, "style sheet", b.get("/static/style.css"), 200, "prefers-color-scheme")
	wantPage(t, "signed in, /login goes to the queue", b.get("/login"), 303)
	wantPage(t, "unknown page", b.get("/nosuch"), 404)
	wantPage(t, "unknown key", b.get("/keys/"+idemadmin.KeyID(key("nosuch"))), 404, "nosuch")
}

func TestPageRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("order-1"))
	b := f.browser()
	b.signIn(opsToken)
	wantPage(t, "detail", b.get("/keys/"+id), 200, "order-1", "Release…", "Complete…", `{&#34;amount&#34;:100}`, "needs_review")

	// The first post only asks for a confirmation.
	p := b.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "note": {"not charged"}})
	wantPage(t, "confirmation", p, 200, "Confirm: release this key?", "Release the key", `name="confirm" value="yes"`, `name="attempt"`, "not charged")
	if got := f.retry(key("order-1")).Outcome; got != idem.NeedsReview {
		t.Fatalf("before the confirmation the key is %v", got)
	}
	p = b.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "note": {"not charged"}, "confirm": {"yes"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/" {
		t.Fatalf("confirmed release: %d %s", p.status, p.body)
	}
	wantPage(t, "queue after release", b.get("/"), 200, "Released key &#34;order-1&#34;", "No keys here")
	if got := f.retry(key("order-1")).Outcome; got != idem.Acquired {
		t.Fatalf("the retry after release: %v", got)
	}
	wantPage(t, "the flash shows once", b.get("/"), 200)
	if strings.Contains(b.get("/").body, "Released key") {
		t.Error("the flash message shows twice")
	}
}

func TestPageComplete(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("order-1"))
	b := f.browser()
	b.signIn(aliceToken)
	b.get("/keys/" + id)
	form := url.Values{"action": {"complete"}, "status": {"201"}, "headers": {"Content-Type: application/json\r\nX-Charge: ch_1\r\n"}, "body": {"{\r\n\"charge\":\"ch_1\"}"}, "note": {"per dashboard"}}
	wantPage(t, "confirmation", b.post("/keys/"+id+"/resolve", form), 200, "store this answer?", "X-Charge", "201")
	form.Set("confirm", "yes")
	p := b.post("/keys/"+id+"/resolve", form)
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/keys/"+id {
		t.Fatalf("confirmed completion: %d %s", p.status, p.body)
	}
	wantPage(t, "completed key", b.get("/keys/"+id), 200, "Completed key", "completed with status 201 by alice", "Delete…")
	r := f.retry(key("order-1"))
	if r.Outcome != idem.Replayed || r.Response.Status != 201 || string(r.Response.Body) != "{\n\"charge\":\"ch_1\"}" || r.Response.Header.Get("X-Charge") != "ch_1" {
		t.Fatalf("the retry: %v %+v", r.Outcome, r.Response)
	}

	// Bad input re-shows the form with the error and what was typed.
	id = f.review(key("order-2"))
	b.get("/keys/" + id)
	p = b.post("/keys/"+id+"/resolve", url.Values{"action": {"complete"}, "status": {"20x"}, "body": {"kept"}})
	wantPage(t, "a bad status", p, 400, "Not changed", "20x", "kept")
	p = b.post("/keys/"+id+"/resolve", url.Values{"action": {"complete"}, "status": {"200"}, "headers": {"Set-Cookie: a=b"}, "confirm": {"yes"}})
	wantPage(t, "a Set-Cookie header", p, 400, "Not changed", "Set-Cookie")
	if got := f.retry(key("order-2")).Outcome; got != idem.NeedsReview {
		t.Fatalf("after refused forms the key is %v", got)
	}

	// Delete, behind its own confirmation.
	done := idemadmin.KeyID(key("order-1"))
	b.get("/keys/" + done)
	wantPage(t, "delete confirmation", b.post("/keys/"+done+"/delete", url.Values{"note": {"charge again"}}), 200, "delete this key?")
	p = b.post("/keys/"+done+"/delete", url.Values{"note": {"charge again"}, "confirm": {"yes"}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("confirmed delete: %d %s", p.status, p.body)
	}
	if got := f.retry(key("order-1")).Outcome; got != idem.Acquired {
		t.Fatalf("after delete: %v", got)
	}
}

// TestPageCSRF: a change without the session's form token, with another
// session's, or from another origin, is refused and changes nothing.
func TestPageCSRF(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("order-1"))
	victim, attacker := f.browser(), f.browser()
	victim.signIn(opsToken)
	attacker.signIn(aliceToken)
	release := func(csrf string) url.Values {
		return url.Values{"action": {"release"}, "confirm": {"yes"}, "csrf": {csrf}}
	}
	for _, tc := range []struct {
		name string
		form url.Values
		hdr  []string
	}{
		{"no form token", url.Values{"action": {"release"}, "confirm": {"yes"}}, nil},
		{"a wrong form token", release("x" + victim.csrf[1:]), nil},
		{"another session's form token", release(attacker.csrf), nil},
		{"cross-site", release(victim.csrf), []string{"Sec-Fetch-Site", "cross-site"}},
		{"another origin", release(victim.csrf), []string{"Origin", "http://evil.example"}},
	} {
		form := tc.form
		if form.Get("csrf") == "" {
			form.Set("csrf", "")
		}
		p := victim.do("POST", "/keys/"+id+"/resolve", form, tc.hdr...)
		if p.status != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403:\n%s", tc.name, p.status, p.body)
		}
	}
	if got := f.retry(key("order-1")).Outcome; got != idem.NeedsReview {
		t.Fatalf("after forged posts the key is %v, want needs_review", got)
	}
	// Signing out needs the token too, so another site cannot sign one out.
	wantPage(t, "sign out without the form token", victim.do("POST", "/logout", url.Values{"csrf": {""}}), 403)
	wantPage(t, "still signed in", victim.get("/"), 200, "Signed in as")
	// The same origin's posts pass.
	victim.get("/keys/" + id)
	p := victim.post("/keys/"+id+"/resolve", release(victim.csrf), "Origin", f.srv.URL, "Sec-Fetch-Site", "same-origin")
	if p.status != http.StatusSeeOther {
		t.Fatalf("a same-origin post: %d %s", p.status, p.body)
	}
}

// TestPageSessionEnds: a session cookie replayed after sign-out or after
// its expiry is worth nothing.
func TestPageSessionEnds(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	f := newFixture(t, func(c *idemadmin.Config) {
		c.Now = func() time.Time { return time.Unix(0, now.Load()) }
		c.SessionTTL = time.Hour
	})
	id := f.review(key("order-1"))
	b := f.browser()
	b.signIn(opsToken)
	u, _ := url.Parse(f.srv.URL)
	stolen := b.c.Jar.Cookies(u)
	csrf := b.csrf
	p := b.post("/logout", url.Values{})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/login" || !strings.Contains(p.header.Get("Set-Cookie"), "Max-Age=0") {
		t.Fatalf("sign out: %d %v", p.status, p.header)
	}
	thief := f.browser()
	thief.c.Jar.SetCookies(u, stolen)
	if p := thief.get("/"); p.status != http.StatusSeeOther {
		t.Fatalf("a cookie replayed after sign-out reads the queue: %d", p.status)
	}
	p = thief.do("POST", "/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}, "csrf": {csrf}})
	wantPage(t, "a change with a cookie replayed after sign-out", p, 401, "session has ended")

	// Expiry, on the injected clock.
	b = f.browser()
	b.signIn(opsToken)
	wantPage(t, "before expiry", b.get("/"), 200)
	now.Add(int64(time.Hour))
	if p := b.get("/"); p.status != http.StatusSeeOther {
		t.Fatalf("an expired session reads the queue: %d", p.status)
	}
	p = b.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}})
	wantPage(t, "a change with an expired session", p, 401)
	if got := f.retry(key("order-1")).Outcome; got != idem.NeedsReview {
		t.Fatalf("the key is %v, want needs_review", got)
	}
}

// TestPageEscapes: keys, paths and reasons with HTML or control characters
// show as text, their control characters visibly.
func TestPageEscapes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := idem.Key{Scope: "s<i>", Operation: "POST /pay\x1b[2J<img src=x onerror=alert(1)>", Key: `<script>alert("k")</script>`}
	lease := f.begin(k, &idemstore.Request{Method: "POST", Path: "/pay\x1b[2J<img src=x onerror=alert(1)>", Query: "q=\u202e", Body: []byte("</pre><script>alert(2)</script>")})
	if err := lease.Escalate(context.Background(), "reset\r\n<b>bold</b>\u202e"); err != nil {
		t.Fatal(err)
	}
	b := f.browser()
	b.signIn(opsToken)
	for _, path := range []string{"/", "/keys/" + idemadmin.KeyID(k)} {
		p := b.get(path)
		wantPage(t, path, p, 200, "&lt;script&gt;alert(&#34;k&#34;)&lt;/script&gt;", `<span class="esc">\x1b</span>[2J&lt;img`,
			`<span class="esc">\u202e</span>`, `<span class="esc">\r</span><span class="esc">\n</span>&lt;b&gt;bold`)
		for _, bad := range []string{"<script>", "<img", "<b>bold", "\x1b", "\u202e"} {
			if strings.Contains(p.body, bad) {
				t.Errorf("%s holds %q unescaped", path, bad)
			}
		}
	}
	wantPage(t, "body", b.get("/keys/"+idemadmin.KeyID(k)), 200, "&lt;/pre&gt;&lt;script&gt;alert(2)")
}

// TestPageTwoOperators: two operators confirm different answers for one
// key; the second is told it was settled, and the first answer stands.
func TestPageTwoOperators(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("order-1"))
	ops, alice := f.browser(), f.browser()
	ops.signIn(opsToken)
	alice.signIn(aliceToken)
	ops.get("/keys/" + id)
	alice.get("/keys/" + id)
	p := ops.post("/keys/"+id+"/resolve", url.Values{"action": {"complete"}, "status": {"201"}, "body": {"charged"}, "confirm": {"yes"}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("the first confirmation: %d %s", p.status, p.body)
	}
	p = alice.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}})
	wantPage(t, "the second confirmation", p, 409, "Not changed", "does not need review", "completed with status 201 by ops", "charged")
	if r := f.retry(key("order-1")); r.Outcome != idem.Replayed || string(r.Response.Body) != "charged" {
		t.Fatalf("the retry: %v", r.Outcome)
	}
}

// TestPageStaleAttempt: an operator who confirms on a page read before
// the key went to review again changes nothing.
func TestPageStaleAttempt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("order-1"))
	b := f.browser()
	b.signIn(opsToken)
	detail := b.get("/keys/" + id)
	attempt := regexp.MustCompile(`name="attempt" value="([^"]+)"`).FindStringSubmatch(detail.body)
	if attempt == nil {
		t.Fatalf("the detail has no attempt:\n%s", detail.body)
	}
	// Meanwhile another operator releases it and the retry fails again.
	wantStatus(t, "release", f.api("POST", "/api/v1/keys/"+id+"/resolve", aliceToken, `{"action":"release","attempt":"`+attempt[1]+`"}`), 200)
	f.review(key("order-1"))
	p := b.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "attempt": {attempt[1]}, "confirm": {"yes"}})
	wantPage(t, "a confirmation from a stale page", p, 409, "Not changed", "went to review again")
	if got := f.retry(key("order-1")).Outcome; got != idem.NeedsReview {
		t.Fatalf("the key is %v, want needs_review", got)
	}
}

// TestPageSignInAttacks: the token is only read from the posted form, and
// a sign-in from another site (login CSRF) is refused.
func TestPageSignInAttacks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.browser()
	wantPage(t, "the token in the query string", b.do("POST", "/login?token="+opsToken, url.Values{}), 401)
	wantPage(t, "the token as a GET", b.get("/login?token="+opsToken), 200, `type="password"`)
	wantPage(t, "still signed out", b.get("/"), 303)
	for _, site := range []string{"cross-site", "same-site"} { // same-site: another port of this host
		p := b.do("POST", "/login", url.Values{"token": {opsToken}}, "Sec-Fetch-Site", site)
		if p.status != http.StatusForbidden || p.header.Get("Set-Cookie") != "" {
			t.Errorf("a %s sign-in: %d, cookie %q", site, p.status, p.header.Get("Set-Cookie"))
		}
	}
	// A change from another port of the same host (the same site, so the
	// SameSite cookie is sent) is refused too, even with the form token.
	id := f.review(key("order-1"))
	b.signIn(opsToken)
	p := b.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}}, "Sec-Fetch-Site", "same-site")
	wantPage(t, "a same-site change", p, 403)
	if got := f.retry(key("order-1")).Outcome; got != idem.NeedsReview {
		t.Fatalf("the key is %v, want needs_review", got)
	}
}
