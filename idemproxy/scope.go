package idemproxy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem"
)

// AnonymousScope is the scope shared by requests that carry none of the
// scope sources, under AnonymousShared.
const AnonymousScope = "anonymous"

// Anonymous is what the proxy does with a protected request that carries
// none of its scope sources (no scope header, no scope cookie).
type Anonymous string

// The anonymous-request policies.
const (
	// AnonymousReject answers 401 (problem type scope-missing) and forwards
	// nothing. The default: requests without credentials would otherwise
	// share one scope, where one client's key replays another's answer.
	AnonymousReject Anonymous = "reject"
	// AnonymousShared puts every such request in AnonymousScope. Choose it
	// only for an API without per-client credentials (a demo, a single
	// trusted caller): a client that guesses or sees another's key gets the
	// other's answer.
	AnonymousShared Anonymous = "shared"
)

// UnmarshalYAML checks the policy name.
func (a *Anonymous) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseAnonymous(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*a = v
	return nil
}

// ParseAnonymous parses "reject" or "shared".
func ParseAnonymous(s string) (Anonymous, error) {
	switch v := Anonymous(s); v {
	case AnonymousReject, AnonymousShared:
		return v, nil
	}
	return "", fmt.Errorf("anonymous must be reject or shared, got %q", s)
}

// Names is a list of header or cookie names. In YAML it is one name or a
// list of names.
type Names []string

// UnmarshalYAML accepts a scalar or a sequence of scalars.
func (ns *Names) UnmarshalYAML(n *yaml.Node) error {
	var list []string
	switch n.Kind {
	case yaml.ScalarNode:
		list = []string{n.Value}
	case yaml.SequenceNode:
		if err := n.Decode(&list); err != nil {
			return fmt.Errorf("line %d: a list of names: %v", n.Line, err)
		}
	default:
		return fmt.Errorf("line %d: a name or a list of names", n.Line)
	}
	for _, s := range list {
		if !validToken(s) {
			return fmt.Errorf("line %d: %q is not a header or cookie name", n.Line, s)
		}
	}
	*ns = list
	return nil
}

// validToken reports whether s is an RFC 9110 token, as header and cookie
// names must be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// ScopeSources are what a request's scope is derived from: the values of
// these headers, then of these cookies, in this order. A request carrying
// none of them is anonymous.
type ScopeSources struct {
	Headers []string
	Cookies []string
}

// MinScopeSecret is the shortest scope secret the proxy accepts, in bytes.
const MinScopeSecret = 16

// ReadSecret reads a secret from a file, as ParseSecret reads it.
func ReadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseSecret(b)
}

// ParseSecret checks a secret given inline (an environment variable): its
// bytes with surrounding white space and a leading byte order mark (which
// some editors write) removed, at least MinScopeSecret bytes. A file and a
// variable holding one secret so give one key.
func ParseSecret(b []byte) ([]byte, error) {
	b = bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(b), []byte("\ufeff")))
	if len(b) < MinScopeSecret {
		return nil, fmt.Errorf("the secret is %d bytes; use at least %d random bytes (e.g. openssl rand -hex 32)", len(b), MinScopeSecret)
	}
	return b, nil
}

// derive returns a key for one use of the secret, so that the scope and the
// fingerprint never share a key.
func derive(secret []byte, use string) []byte {
	if len(secret) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, secret)
	io.WriteString(m, "idem/v1/"+use)
	return m.Sum(nil)
}

// NewScope returns the ScopeFunc of the proxy: the scope is a digest of the
// values of the sources present, each framed with its kind, name and length,
// so that no two different sets of values give one scope. With a secret it
// is HMAC-SHA-256 under a key derived from the secret, which nobody without
// the secret can match against guessed credentials; without, a plain
// SHA-256. No source configured means the Authorization header.
//
// A request with none of the sources gets idem.ErrScopeMissing (401) under
// AnonymousReject, AnonymousScope under AnonymousShared.
func NewScope(src ScopeSources, secret []byte, anon Anonymous) idem.ScopeFunc {
	if len(src.Headers) == 0 && len(src.Cookies) == 0 {
		src.Headers = []string{DefaultScopeHeader}
	}
	headers := make([]string, len(src.Headers))
	for i, h := range src.Headers {
		headers[i] = http.CanonicalHeaderKey(h)
	}
	cookies := append([]string(nil), src.Cookies...)
	key := derive(secret, "scope")
	// One unkeyed header keeps the digest of earlier versions (the SHA-256
	// of its values joined by newlines), so that keys stored before an
	// upgrade keep their scope.
	legacy := key == nil && len(headers) == 1 && len(cookies) == 0
	newHash := func() hash.Hash {
		if key != nil {
			return hmac.New(sha256.New, key)
		}
		return sha256.New()
	}
	return func(r *http.Request) (string, error) {
		found := false
		for _, h := range headers {
			if present(r.Header[h]) {
				found = true
				break
			}
		}
		for _, c := range cookies {
			if !found {
				found = present(cookieValues(r.Header, c))
			}
		}
		if !found {
			if anon == AnonymousShared {
				return AnonymousScope, nil
			}
			return "", idem.ErrScopeMissing
		}
		h := newHash()
		var sum [sha256.Size]byte
		if legacy {
			for i, v := range r.Header[headers[0]] {
				if i > 0 {
					h.Write([]byte{'\n'})
				}
				io.WriteString(h, v)
			}
			return hex.EncodeToString(h.Sum(sum[:0])), nil
		}
		var buf []byte
		field := func(s string) {
			buf = binary.AppendUvarint(buf, uint64(len(s)))
			buf = append(buf, s...)
		}
		for _, name := range headers {
			vs := r.Header[name]
			buf = append(buf, 'h')
			field(name)
			buf = binary.AppendUvarint(buf, uint64(len(vs)))
			for _, v := range vs {
				field(v)
			}
		}
		for _, name := range cookies {
			vs := cookieValues(r.Header, name)
			buf = append(buf, 'c')
			field(name)
			buf = binary.AppendUvarint(buf, uint64(len(vs)))
			for _, v := range vs {
				field(v)
			}
		}
		h.Write(buf)
		return hex.EncodeToString(h.Sum(sum[:0])), nil
	}
}

// cookieValues returns the values of the cookies named name in h's Cookie
// lines, in order, as net/http reads them (surrounding white space and
// double quotes removed) but keeping the values net/http drops for bytes
// RFC 6265 disallows (JSON, backslash escapes, UTF-8) and without its limit
// on the number of cookies: each is still the client's credential, and
// dropping it would make the request anonymous, where it shares a scope
// with every other such request under AnonymousShared.
func cookieValues(h http.Header, name string) []string {
	var vs []string
	for _, line := range h["Cookie"] {
		for part := range strings.SplitSeq(line, ";") {
			n, v, _ := strings.Cut(strings.Trim(part, asciiSpace), "=")
			if strings.Trim(n, asciiSpace) != name {
				continue
			}
			if len(v) > 1 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			vs = append(vs, v)
		}
	}
	return vs
}

// asciiSpace is the white space net/http trims around cookies.
const asciiSpace = " \t\r\n"

// present reports whether a header or cookie has a value other than white
// space.
func present(vs []string) bool {
	for _, v := range vs {
		if strings.TrimSpace(v) != "" {
			return true
		}
	}
	return false
}

// noSecretWarning is logged at startup when scopes are unkeyed.
const noSecretWarning = ("scopes are unkeyed SHA-256 digests of the credentials: whoever reads the store can test guesses of short API keys or passwords against them; set --scope-secret-file or IDEM_SCOPE_SECRET")
