package idemadmin_test

// One sign-in for a fleet: several handlers over one store accept each
// other's sessions, a sign-out on one ends the session on all, and
// forged, altered, foreign and replayed cookies are refused.

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// peer is another instance of the fleet: a handler over f's store with
// f's tokens (unless tweaked), as another idem serve behind the same load
// balancer.
func (f *fixture) peer(tweak ...func(*idemadmin.Config)) *fixture {
	f.t.Helper()
	p := *f
	cfg := idemadmin.Config{Store: f.store, Tokens: map[string]string{"ops": opsToken, "alice": aliceToken},
		Logger: slog.New(slog.NewTextHandler(f.log, nil))}
	for _, tw := range tweak {
		tw(&cfg)
	}
	var err error
	if p.handler, err = idemadmin.New(cfg); err != nil {
		f.t.Fatal(err)
	}
	p.srv = httptest.NewServer(p.handler)
	f.t.Cleanup(p.srv.Close)
	return &p
}

// on returns b as seen by another instance: the same cookies (a cookie
// jar keeps them by host, not port), the same form token.
func (b *browser) on(f *fixture) *browser {
	c := *b
	c.f = f
	return &c
}

func sessionCookie(t *testing.T, b *browser) *http.Cookie {
	t.Helper()
	u, _ := url.Parse(b.f.srv.URL)
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "idem_admin_session" {
			return c
		}
	}
	t.Fatal("no session cookie")
	return nil
}

// withCookie returns a new browser of f that holds only value as its
// session cookie.
func (f *fixture) withCookie(value string) *browser {
	b := f.browser()
	u, _ := url.Parse(f.srv.URL)
	b.c.Jar.SetCookies(u, []*http.Cookie{{Name: "idem_admin_session", Value: value}})
	return b
}

// TestFleetSignInOnce: an operator signs in on one instance and acts
// through another; signing out on the second ends the session on the
// first too, and a replayed cookie is refused by both.
func TestFleetSignInOnce(t *testing.T) {
	t.Parallel()
	a := newFixture(t)
	b := a.peer()
	id := a.review(key("order-1"))
	onA := a.browser()
	onA.signIn(opsToken)
	stolen := sessionCookie(t, onA).Value

	onB := onA.on(b)
	wantPage(t, "the queue through the other instance", onB.get("/"), 200, "Signed in as <strong>ops</strong>", "order-1")
	onB.get("/keys/" + id)
	p := onB.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "note": {"not charged"}, "confirm": {"yes"}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("a release through the other instance: %d %s", p.status, p.body)
	}
	// The message of the change shows on whichever instance serves the
	// next page.
	wantPage(t, "the flash on the first instance", onA.get("/"), 200, "Released key &#34;order-1&#34;")
	if got := a.retry(key("order-1")).Outcome; got != idem.Acquired {
		t.Fatalf("after the release the key is %v", got)
	}

	// Sign out through B; A refuses the session from then on.
	if p := onB.post("/logout", url.Values{}); p.status != http.StatusSeeOther {
		t.Fatalf("sign out: %d %s", p.status, p.body)
	}
	for _, f := range []*fixture{a, b} {
		thief := f.withCookie(stolen)
		if p := thief.get("/"); p.status != http.StatusSeeOther {
			t.Errorf("%s: a cookie replayed after sign-out reads the queue: %d", f.srv.URL, p.status)
		}
		id := f.review(key("order-2-" + f.srv.URL))
		p := thief.do("POST", "/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}, "csrf": {onA.csrf}, "attempt": {f.attempt(key("order-2-" + f.srv.URL))}})
		wantPage(t, "a change with a cookie replayed after sign-out", p, 401, "session has ended")
	}
	// A fresh instance (a restart, a new one behind the balancer) knows
	// too: the sign-out is in the store.
	c := a.peer()
	if p := c.withCookie(stolen).get("/"); p.status != http.StatusSeeOther {
		t.Errorf("a new instance accepts a signed-out session: %d", p.status)
	}
	// The sign-out is no key: listings, the detail and changes never show
	// or touch it.
	var list idemadmin.Page
	a.api("GET", "/api/v1/keys?state=completed", opsToken, "").decode(t, &list)
	for _, it := range list.Items {
		if it.Scope == idemadmin.SessionScope {
			t.Errorf("the listing shows a sign-out: %+v", it)
		}
	}
	recs, err := a.store.List(context.Background(), idemstore.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs.Records {
		if rec.Key.Scope != idemadmin.SessionScope {
			continue
		}
		rid := idemadmin.KeyID(rec.Key)
		wantStatus(t, "the sign-out's detail", a.api("GET", "/api/v1/keys/"+rid, opsToken, ""), 404)
		wantStatus(t, "deleting the sign-out", a.api("DELETE", "/api/v1/keys/"+rid, opsToken, `{"attempt":"*"}`), 404)
		wantPage(t, "the sign-out's page", onA.on(a).get("/keys/"+rid), 303)
	}
}

// TestSessionCookieAttacks: a cookie altered in any part, made up, from
// another fleet (the same name, another token), or of a token since
// removed or changed, is refused, logged without the token, and changes
// nothing.
func TestSessionCookieAttacks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("order-1"))
	b := f.browser()
	b.signIn(opsToken)
	good := sessionCookie(t, b).Value
	parts := strings.Split(good, "|")
	if len(parts) != 6 {
		t.Fatalf("the cookie %q", good)
	}
	alter := func(i int, v string) string {
		p := append([]string(nil), parts...)
		p[i] = v
		return strings.Join(p, "|")
	}
	other := f.peer(func(c *idemadmin.Config) { c.Tokens = map[string]string{"ops": "another-fleet-token-0123456789"} })
	foreign := other.browser()
	foreign.signIn("another-fleet-token-0123456789")
	for what, value := range map[string]string{
		"another name":             alter(1, "alice"),
		"a later expiry":           alter(4, "99999999999"),
		"an earlier start":         alter(3, "0"),
		"another session id":       alter(2, "AAAAAAAAAAAAAAAAAAAAAA"),
		"another version":          alter(0, "v2"),
		"no signature":             alter(5, ""),
		"a signature of zeros":     alter(5, strings.Repeat("A", len(parts[5]))),
		"a made-up name":           alter(1, "mallory"),
		"a cut cookie":             good[:len(good)-3],
		"junk":                     "x",
		"a huge cookie":            good + strings.Repeat("A", 3000),
		"another fleet's, for ops": sessionCookie(t, foreign).Value,
	} {
		c := f.withCookie(value)
		if p := c.get("/"); p.status != http.StatusSeeOther {
			t.Errorf("%s: the queue answers %d", what, p.status)
		}
		p := c.do("POST", "/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}, "csrf": {b.csrf}, "attempt": {f.attempt(key("order-1"))}})
		if p.status != http.StatusUnauthorized {
			t.Errorf("%s: a release answers %d", what, p.status)
		}
	}
	if got := f.retry(key("order-1")).Outcome; got != idem.NeedsReview {
		t.Fatalf("after forged cookies the key is %v", got)
	}
	// Another fleet's form token does not pass here either, with the good
	// cookie.
	p := b.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}, "csrf": {foreign.csrf}})
	wantPage(t, "another fleet's form token", p, 403)
	log := f.log.String()
	if !strings.Contains(log, `msg="admin: session cookie refused"`) {
		t.Errorf("refused cookies are not logged:\n%s", log)
	}
	for _, tok := range []string{opsToken, aliceToken, "another-fleet-token"} {
		if strings.Contains(log, tok) {
			t.Errorf("the log holds a token")
		}
	}

	// The token file changes: ops's token is removed. ops's sessions end,
	// alice's go on.
	alice := f.browser()
	alice.signIn(aliceToken)
	if err := f.handler.SetTokens(map[string]string{"alice": aliceToken}); err != nil {
		t.Fatal(err)
	}
	if p := b.get("/"); p.status != http.StatusSeeOther {
		t.Errorf("a session of a removed token reads the queue: %d", p.status)
	}
	wantPage(t, "alice after the reload", alice.get("/"), 200, "Signed in as <strong>alice</strong>")
	// ops comes back with a new token: the old sessions stay dead.
	if err := f.handler.SetTokens(map[string]string{"alice": aliceToken, "ops": "ops-new-token-0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	if p := f.withCookie(good).get("/"); p.status != http.StatusSeeOther {
		t.Errorf("a session of a changed token reads the queue: %d", p.status)
	}
	if err := f.handler.SetTokens(map[string]string{"bad": "short"}); err == nil {
		t.Error("SetTokens took a short token")
	}
	wantPage(t, "alice after a refused reload", alice.get("/"), 200)
}

// TestSessionExpiresOnEveryInstance: a session ends at its expiry by the
// signing instance's clock, whichever instance is asked.
func TestSessionExpiresOnEveryInstance(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func(c *idemadmin.Config) {
		c.Now = func() time.Time { return time.Unix(0, now.Load()) }
		c.SessionTTL = time.Hour
	}
	a := newFixture(t, clock)
	b := a.peer(clock)
	onA := a.browser()
	onA.signIn(opsToken)
	wantPage(t, "before expiry", onA.on(b).get("/"), 200)
	now.Add(int64(time.Hour - time.Second))
	wantPage(t, "a second before expiry", onA.on(b).get("/"), 200)
	now.Add(int64(time.Second))
	for _, f := range []*fixture{a, b} {
		if p := onA.on(f).get("/"); p.status != http.StatusSeeOther {
			t.Errorf("an expired session reads the queue: %d", p.status)
		}
	}
}

// TestSignInRateLimited: an address that gives wrong tokens is refused
// after SignInFailures of them, even with the right token, until it
// regains a try; other addresses are not; every refusal is logged
// without the token tried, the lockout once.
func TestSignInRateLimited(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	f := newFixture(t, func(c *idemadmin.Config) {
		c.Now = func() time.Time { return time.Unix(0, now.Load()) }
		c.SignInFailures, c.SignInRegain = 3, time.Minute
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	from := func(addr string) []string { return []string{"X-Forwarded-For", addr + ", 127.0.0.1"} }
	b := f.browser()
	for i := 0; i < 3; i++ {
		wantPage(t, "a wrong token", b.do("POST", "/login", url.Values{"token": {"wrong-token-attempt-" + string(rune('a'+i))}}, from("192.0.2.7")...), 401)
	}
	p := b.do("POST", "/login", url.Values{"token": {opsToken}}, from("192.0.2.7")...)
	wantPage(t, "the right token after 3 wrong ones", p, 429, "Too many wrong tokens")
	if p.header.Get("Retry-After") == "" || p.header.Get("Set-Cookie") != "" {
		t.Errorf("the refusal: Retry-After %q, Set-Cookie %q", p.header.Get("Retry-After"), p.header.Get("Set-Cookie"))
	}
	// The API counts by the same address.
	req := func(addr, tok string) int {
		r, _ := http.NewRequest("GET", f.srv.URL+"/api/v1/keys", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		r.Header.Set("X-Forwarded-For", addr)
		resp, err := f.srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := req("192.0.2.7", opsToken); got != 429 {
		t.Errorf("the API from the locked-out address: %d", got)
	}
	// Another address behind the same balancer is not locked out; a
	// forged header from an untrusted peer counts by the peer.
	if got := req("198.51.100.1", opsToken); got != 200 {
		t.Errorf("the API from another address: %d", got)
	}
	wantPage(t, "another address signs in", f.browser().do("POST", "/login", url.Values{"token": {opsToken}}, from("198.51.100.1")...), 303)
	// A minute later one try is back.
	now.Add(int64(time.Minute))
	wantPage(t, "after a minute", b.do("POST", "/login", url.Values{"token": {opsToken}}, from("192.0.2.7")...), 303)
	log := f.log.String()
	if n := strings.Count(log, "sign-in refused: wrong token"); n != 3 || !strings.Contains(log, "level=WARN") || !strings.Contains(log, "client=192.0.2.7") {
		t.Errorf("%d wrong-token lines:\n%s", n, log)
	}
	if n := strings.Count(log, "too many wrong tokens from this address"); n != 1 {
		t.Errorf("the lockout is logged %d times:\n%s", n, log)
	}
	if strings.Contains(log, "wrong-token-attempt") || strings.Contains(log, opsToken) {
		t.Errorf("the log holds a token tried:\n%s", log)
	}
}

// failingStore fails what fail says, with ErrUnavailable.
type failingStore struct {
	idemstore.Store
	fail atomic.Value // string: "get", "reserve" or ""
}

func (s *failingStore) Get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	if s.fail.Load() == "get" {
		return nil, idemstore.ErrUnavailable
	}
	return s.Store.Get(ctx, k)
}

func (s *failingStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if s.fail.Load() == "reserve" {
		return nil, false, idemstore.ErrUnavailable
	}
	return s.Store.Reserve(ctx, p)
}

// TestSessionStoreDown: with the store down, a session cannot be checked
// for a sign-out, and the page refuses it (503) rather than trust it; a
// sign-out the store cannot record says so, and this instance still
// refuses the session.
func TestSessionStoreDown(t *testing.T) {
	t.Parallel()
	base := newFixture(t)
	fs := &failingStore{Store: base.store}
	fs.fail.Store("")
	f := base.peer(func(c *idemadmin.Config) { c.Store = fs })
	other := base.peer()
	b := f.browser()
	b.signIn(opsToken)
	cookie := sessionCookie(t, b).Value
	fs.fail.Store("get")
	wantPage(t, "the queue with the store down", b.get("/"), 503, "cannot check")
	fs.fail.Store("reserve")
	p := b.post("/logout", url.Values{})
	wantPage(t, "a sign-out the store cannot record", p, 503, "other servers of the fleet accept your session until")
	fs.fail.Store("")
	if p := f.withCookie(cookie).get("/"); p.status != http.StatusSeeOther {
		t.Errorf("this instance accepts a session it signed out: %d", p.status)
	}
	// What the page said: another instance accepts it still.
	wantPage(t, "another instance", other.withCookie(cookie).get("/"), 200)
	if !strings.Contains(f.log.String(), "sign-out not recorded") {
		t.Error("the failed sign-out is not logged")
	}
}

// TestFlashCannotBeForged: the message a change leaves for the next page
// shows only to the session it was left for; a made-up one, or another
// session's, shows nothing.
func TestFlashCannotBeForged(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.review(key("order-1"))
	victim, other := f.browser(), f.browser()
	victim.signIn(opsToken)
	other.signIn(aliceToken)
	u, _ := url.Parse(f.srv.URL)
	// A made-up message.
	victim.c.Jar.SetCookies(u, []*http.Cookie{{Name: "idem_admin_flash", Value: "Q2FsbCArMSA1NTUgMDEwMCBub3c.AAAA"}})
	if p := victim.get("/"); strings.Contains(p.body, `class="flash"`) {
		t.Errorf("a made-up flash shows:\n%s", p.body)
	}
	// Another session's real message.
	other.get("/keys/" + id)
	if p := other.post("/keys/"+id+"/resolve", url.Values{"action": {"release"}, "confirm": {"yes"}}); p.status != http.StatusSeeOther {
		t.Fatalf("release: %d", p.status)
	}
	var flash *http.Cookie
	for _, c := range other.c.Jar.Cookies(u) {
		if c.Name == "idem_admin_flash" {
			flash = c
		}
	}
	if flash == nil {
		t.Fatal("no flash cookie")
	}
	victim.c.Jar.SetCookies(u, []*http.Cookie{flash})
	if p := victim.get("/"); strings.Contains(p.body, `class="flash"`) {
		t.Errorf("another session's flash shows:\n%s", p.body)
	}
	wantPage(t, "its own session", other.get("/"), 200, `class="flash"`, "Released key")
}
