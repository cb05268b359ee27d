package idem

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// The method rule. HTTP methods are case-sensitive tokens (RFC 9110 §9.1),
// but many servers and frameworks upper-case the method before they route
// (Werkzeug, and any Go handler that calls strings.ToUpper), so that a
// request line "post /pay" runs the POST handler. The middleware therefore
// never lets a spelling of a protected method through unprotected:
//
//   - a method listed in Config.Methods, byte for byte, is protected;
//   - HEAD is protected wherever GET is (and HEAD is not listed itself):
//     servers answer HEAD by running the GET handler. It is the same
//     operation as GET (the Operation func sees the method GET), and its
//     fingerprint keeps the method HEAD, so one key used for a HEAD and
//     then a GET gets 422 instead of running twice;
//   - a method that equals a protected one but for ASCII case ("post",
//     "Post", "hEAD" where GET is protected) is refused with 400
//     (SituationInvalidMethod), never passed on;
//   - a method that is not an RFC 9110 token (a blank, a delimiter, or a
//     byte outside ASCII, such as the 'ſ' or 'ı' that Unicode upper-cases
//     to 'S' and 'I') is refused with 400 too, whatever the protected
//     methods are: it cannot be told from a spelling of one;
//   - any other method passes through unprotected.
//
// Route policies (Config.Routes) and Policy.Disabled are looked up under
// the canonical spelling, so a refused spelling of a disabled route's
// method passes through as the route's own method would; in observe mode
// a refused method is forwarded as FindingWouldRefuse.

// methodClass is how the middleware treats a request's method.
type methodClass uint8

const (
	methodProtected   methodClass = iota // listed in Config.Methods
	methodUnprotected                    // passes through
	methodHeadOfGet                      // HEAD where GET is protected
	methodMisspelt                       // a protected method in another case: refused
	methodInvalid                        // not a token: refused
)

// classify returns how a method not listed in Config.Methods is treated,
// and the protected method it stands for ("" for none).
func (m *middleware) classify(method string) (methodClass, string) {
	getProtected := slices.Contains(m.cfg.Methods, http.MethodGet) && !slices.Contains(m.cfg.Methods, http.MethodHead)
	if method == http.MethodHead && getProtected {
		return methodHeadOfGet, http.MethodGet
	}
	if !validHeaderName(method) { // a method is a token, as a header name is
		return methodInvalid, ""
	}
	for _, p := range m.cfg.Methods {
		if strings.EqualFold(p, method) { // ASCII only: method is a token
			return methodMisspelt, p
		}
	}
	if getProtected && strings.EqualFold(method, http.MethodHead) {
		return methodMisspelt, http.MethodGet
	}
	return methodUnprotected, ""
}

// methodDetail explains why method was refused.
func methodDetail(class methodClass, method string) string {
	if class == methodInvalid {
		return "The request's method is not an HTTP token (RFC 9110), so idem cannot tell whether it names a protected method; it was not run."
	}
	return "HTTP methods are case-sensitive: send " + strings.ToUpper(method) + ". The request was not run."
}

// checkMethods reports protected methods that are not tokens, or that are
// listed twice, in any case.
func checkMethods(methods []string) error {
	for i, m := range methods {
		if !validHeaderName(m) {
			return fmt.Errorf("idem: Config.Methods: %q is not an HTTP method (a token)", m)
		}
		for _, o := range methods[:i] {
			if strings.EqualFold(o, m) {
				return fmt.Errorf("idem: Config.Methods lists %q and %q: methods differing only in case cannot both be protected", o, m)
			}
		}
	}
	return nil
}
