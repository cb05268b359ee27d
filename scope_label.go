package idem

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
)

// HeaderScopeLabel returns a Config.ScopeLabel that labels each new key
// with the request's values of the header name, joined with ", " (no
// label when it has none). Name a header that your gateway sets after it
// authenticated the caller, to an opaque ID of theirs (X-Account-Id):
// the label is for operators, who see it in clear, and decides nothing.
//
// NewMiddleware refuses the label of a header that carries credentials
// (Authorization, Proxy-Authorization, Cookie), or of a name that is not
// a header name.
func HeaderScopeLabel(name string) func(*http.Request) string {
	canon := http.CanonicalHeaderKey(name)
	if !validHeaderName(name) || credentialHeader(canon) {
		return refusedScopeLabel(name)
	}
	return func(r *http.Request) string {
		switch vs := r.Header[canon]; len(vs) {
		case 0:
			return ""
		case 1:
			return vs[0]
		default:
			return strings.Join(vs, ", ")
		}
	}
}

// credentialHeader reports whether the canonical header name carries a
// client's credentials, which a label must never show.
func credentialHeader(canon string) bool {
	switch canon {
	case "Authorization", "Proxy-Authorization", "Cookie":
		return true
	}
	return false
}

// refusedScopeLabel is what HeaderScopeLabel returns for a header it must
// not read: a function that labels nothing, which NewMiddleware knows by
// its code (refusedScopeLabelCode) and refuses, naming the header it
// returns for a nil request. It is never inlined, so that its function
// literal is compiled once, whoever calls HeaderScopeLabel.
//
//go:noinline
func refusedScopeLabel(name string) func(*http.Request) string {
	return func(r *http.Request) string {
		if r == nil {
			return name
		}
		return ""
	}
}

// refusedScopeLabelCode is the code of refusedScopeLabel's functions.
var refusedScopeLabelCode = reflect.ValueOf(refusedScopeLabel("")).Pointer()

// checkScopeLabel reports a Config.ScopeLabel made by HeaderScopeLabel for
// a header it refuses.
func checkScopeLabel(f func(*http.Request) string) error {
	if f == nil || reflect.ValueOf(f).Pointer() != refusedScopeLabelCode {
		return nil
	}
	name := f(nil)
	if !validHeaderName(name) {
		return fmt.Errorf("idem: Config.ScopeLabel: HeaderScopeLabel(%q): not a header name", name)
	}
	return fmt.Errorf("idem: Config.ScopeLabel: HeaderScopeLabel(%q): %s carries credentials, which a scope label, shown to operators in clear, must never hold; name a header with an opaque ID of the caller",
		name, http.CanonicalHeaderKey(name))
}
