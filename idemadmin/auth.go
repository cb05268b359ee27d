package idemadmin

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"sort"
	"strings"
)

// tokenSet checks presented tokens against the configured ones in
// constant time: every token is compared (by its SHA-256, so lengths do
// not matter), whichever matches.
type tokenSet struct {
	names []string
	sums  [][sha256.Size]byte
}

func newTokenSet(tokens map[string]string) tokenSet {
	var ts tokenSet
	for name := range tokens {
		ts.names = append(ts.names, name)
	}
	sort.Strings(ts.names)
	for _, name := range ts.names {
		ts.sums = append(ts.sums, sha256.Sum256([]byte(tokens[name])))
	}
	return ts
}

// match returns the name of the token an operator presents, or false. What
// the docs tell operators to give is accepted: the token itself, or a
// whole line of the token file, NAME:TOKEN, when NAME is that token's own
// name (so that a line never signs in under another token's name).
// Surrounding white space, such as the newline of a copied line or the
// carriage return of a file written on Windows, is ignored; tokens hold
// none. A name alone matches nothing.
func (ts tokenSet) match(presented string) (string, bool) {
	presented = strings.TrimSpace(presented)
	// Both readings are compared, every time, in constant time: which one
	// matched shows only in the name returned.
	bare, isToken := ts.lookup(presented)
	name, tok, hasName := strings.Cut(presented, ":")
	owner, isLine := ts.lookup(tok)
	switch {
	case isToken:
		return bare, true
	case hasName && isLine && owner == name:
		return owner, true
	}
	return "", false
}

// lookup returns the name of the token tok, or false.
func (ts tokenSet) lookup(tok string) (string, bool) {
	sum := sha256.Sum256([]byte(tok))
	found := -1
	for i := range ts.sums {
		if subtle.ConstantTimeCompare(sum[:], ts.sums[i][:]) == 1 {
			found = i
		}
	}
	if found < 0 || tok == "" {
		return "", false
	}
	return ts.names[found], true
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header.
// A token anywhere else (a query string, a cookie) is not looked at: URLs
// end up in logs and browser histories.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Values("Authorization")
	if len(h) != 1 {
		return "", false
	}
	scheme, tok, ok := strings.Cut(h[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// errUnauthorized is the API's answer without a valid token.
var errUnauthorized = &Error{Status: http.StatusUnauthorized, Code: CodeUnauthorized,
	Detail: "a valid admin token is required: send Authorization: Bearer TOKEN (a token of --admin-token-file or IDEM_ADMIN_TOKEN, alone or as its whole NAME:TOKEN line)"}

// errTooManyFailures answers a client address that has used up its failed
// sign-ins (Config.SignInFailures).
var errTooManyFailures = &Error{Status: http.StatusTooManyRequests, Code: CodeRateLimited,
	Detail: "too many wrong admin tokens from this address: wait for Retry-After seconds before trying again"}
