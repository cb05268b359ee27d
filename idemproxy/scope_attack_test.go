package idemproxy_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemproxy"
)

// cookieRequest is a request whose Cookie header is raw, as a browser or a
// hostile client writes it (http.Cookie would refuse some of these values).
func cookieRequest(cookie ...string) *http.Request {
	r := httptest.NewRequest("POST", "/payments", nil)
	for _, c := range cookie {
		r.Header.Add("Cookie", c)
	}
	return r
}

// TestScopeCookieValuesGoRefuses: a session cookie whose value net/http
// refuses to parse (JSON with quotes, a backslash escape as Python's
// SimpleCookie writes, UTF-8) is still the client's credential. It must
// neither make the request anonymous (two such clients would share the
// anonymous scope under --anonymous shared) nor be rejected as missing.
func TestScopeCookieValuesGoRefuses(t *testing.T) {
	t.Parallel()
	src := idemproxy.ScopeSources{Cookies: []string{"session"}}
	shared := idemproxy.NewScope(src, nil, idemproxy.AnonymousShared)
	reject := idemproxy.NewScope(src, nil, idemproxy.AnonymousReject)
	pairs := [][2]string{
		{`session={"uid":"alice","sig":"a1"}`, `session={"uid":"mallory","sig":"m6"}`},
		{`session="alice\054a1"`, `session="mallory\054m6"`},
		{`session=ålice-a1`, `session=mållory-m6`},
	}
	for _, p := range pairs {
		alice, mallory := cookieRequest(p[0]), cookieRequest(p[1])
		a, m := scopeOf(t, shared, alice), scopeOf(t, shared, mallory)
		if a == idemproxy.AnonymousScope || a == m {
			t.Errorf("%s and %s: scopes %q and %q; each client needs its own", p[0], p[1], a, m)
		}
		if _, err := reject(alice); err != nil {
			t.Errorf("%s: %v; the request carries a session", p[0], err)
		}
		if scopeOf(t, reject, alice) != a {
			t.Errorf("%s: the anonymous policy changed a credentialed scope", p[0])
		}
	}
}

// TestScopeCookieValuesUnchanged: the values net/http parses keep the scope
// they had (surrounding quotes stripped), so that stored keys keep theirs.
func TestScopeCookieValuesUnchanged(t *testing.T) {
	t.Parallel()
	f := idemproxy.NewScope(idemproxy.ScopeSources{Cookies: []string{"session"}}, nil, idemproxy.AnonymousReject)
	for _, c := range []string{"abc", `"abc"`, "a b", "a,b", "%20x"} {
		want := scopeOf(t, f, requestWith(nil, &http.Cookie{Name: "session", Value: strings.Trim(c, `"`)}))
		if got := scopeOf(t, f, cookieRequest("theme=dark; session="+c)); got != want {
			t.Errorf("session=%s: scope %s, want %s (as net/http parses it)", c, got, want)
		}
	}
	// Two sessions in two Cookie lines or in one are the same two values.
	one := scopeOf(t, f, cookieRequest("session=a; session=b"))
	two := scopeOf(t, f, cookieRequest("session=a", "session=b"))
	if one != two {
		t.Error("the scope depends on how the Cookie lines are split")
	}
	if one == scopeOf(t, f, cookieRequest("session=b; session=a")) {
		t.Error("the order of two session cookies does not count")
	}
}

// TestScopeBlankCookie: a cookie of white space only is no more a
// credential than a header of white space only.
func TestScopeBlankCookie(t *testing.T) {
	t.Parallel()
	f := idemproxy.NewScope(idemproxy.ScopeSources{Cookies: []string{"session"}}, nil, idemproxy.AnonymousReject)
	for _, c := range []string{`session=" "`, `session="  "`, "session=", `session=""`} {
		if _, err := f(cookieRequest(c)); !errors.Is(err, idem.ErrScopeMissing) {
			t.Errorf("%s: %v, want ErrScopeMissing", c, err)
		}
	}
}

// TestScopeSecretByteOrderMark: a secret file saved by an editor that
// writes a byte order mark holds the same secret as the environment
// variable without one; otherwise two instances would disagree on every
// scope, and each would run the other's retries again.
func TestScopeSecretByteOrderMark(t *testing.T) {
	t.Parallel()
	const secret = "0123456789abcdef-shared"
	plain, err := idemproxy.ParseSecret([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{"\ufeff" + secret + "\n", secret + "\r\n", "  " + secret} {
		got, err := idemproxy.ParseSecret([]byte(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if string(got) != string(plain) {
			t.Errorf("%q parses to %q, not the secret %q", in, got, plain)
		}
	}
}
