package idem

import (
	"errors"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
)

// canonicalNames returns names in canonical header form, or nil for none.
func canonicalNames(names []string) []string {
	if len(names) == 0 {
		return nil
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(n))
	}
	return out
}

// validHeaderName reports whether n is an RFC 9110 token.
func validHeaderName(n string) bool {
	if n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// NeverStoredHeader reports whether idem never stores the response header
// name, whatever the policy: Set-Cookie, Date, hop-by-hop headers,
// credentials and Content-Length.
func NeverStoredHeader(name string) bool {
	return unstored(textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name)))
}

// hasHeaderRules reports whether the policy filters the stored headers.
func (p *Policy) hasHeaderRules() bool { return len(p.KeepHeaders) > 0 || len(p.DropHeaders) > 0 }

// storedResponse returns resp with only the headers the policy keeps
// (KeepHeaders, DropHeaders); the engine then removes those never stored.
func (p *Policy) storedResponse(resp *Response) *Response {
	if !p.hasHeaderRules() || resp.Header == nil {
		return resp
	}
	h := make(http.Header, len(resp.Header))
	for name, v := range resp.Header {
		cn := textproto.CanonicalMIMEHeaderKey(name)
		if len(p.KeepHeaders) > 0 && !alwaysKept(cn) && !slices.Contains(p.KeepHeaders, cn) {
			continue
		}
		if slices.Contains(p.DropHeaders, cn) {
			continue
		}
		h[name] = v
	}
	out := *resp
	out.Header = h
	return &out
}

// checkProblemBase reports a Config.ProblemBaseURL that is not absolute.
func checkProblemBase(base string) error {
	if base == "" {
		return nil
	}
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return errors.New("idem: Config.ProblemBaseURL " + `"` + base + `"` + " must be an absolute URL (https://api.example.com/problems#)")
	}
	return nil
}

// RebaseProblemType returns the problem type URI t with base in place of
// ProblemTypeBase, or t itself when base is empty or t is not one of
// idem's (see Config.ProblemBaseURL).
func RebaseProblemType(t, base string) string {
	if base == "" || !strings.HasPrefix(t, ProblemTypeBase) {
		return t
	}
	return base + t[len(ProblemTypeBase):]
}

// alwaysKept reports the headers Policy.KeepHeaders cannot leave out: those
// that say how to read the stored body, and what it was negotiated by.
func alwaysKept(name string) bool {
	return name == "Content-Type" || name == "Content-Encoding" || name == "Vary"
}
