package idem

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/idemstore"
)

// Key identifies one idempotency record: whose it is (Scope), what is being
// done (Operation) and the client's Idempotency-Key value (Key).
type Key = idemstore.Key

// MaxKeyLength is the longest Idempotency-Key value idem accepts, in bytes.
const MaxKeyLength = idemstore.MaxKeyLength

// MaxScopeLength and MaxOperationLength bound a Key's Scope and Operation,
// in bytes. Every store keeps values this long (idemmysql's columns are sized
// for them, and with a MaxKeyLength key they fit PostgreSQL's index limit);
// Engine.Begin refuses longer ones with ErrTooLong before they reach the
// store. An operation taken from a request path is the one a client can
// make long; the middleware answers it with 414.
const (
	MaxScopeLength     = idemstore.MaxScopeLength
	MaxOperationLength = idemstore.MaxOperationLength
)

// ErrTooLong is returned by Engine.Begin for a Key whose Scope or Operation
// is longer than MaxScopeLength or MaxOperationLength.
var ErrTooLong = errors.New("idem: scope or operation too long")

// checkKeyLengths returns an error wrapping ErrTooLong when k's scope or
// operation is too long to store.
func checkKeyLengths(k Key) error {
	switch {
	case len(k.Operation) > MaxOperationLength:
		return fmt.Errorf("%w: the operation is %d bytes long; at most %d are kept", ErrTooLong, len(k.Operation), MaxOperationLength)
	case len(k.Scope) > MaxScopeLength:
		return fmt.Errorf("%w: the scope is %d bytes long; at most %d are kept", ErrTooLong, len(k.Scope), MaxScopeLength)
	}
	return nil
}

// checkScope returns an error wrapping ErrScopeMissing for a scope that is
// empty or only white space: every such caller would share one scope, where
// one caller's key replays another's answer. Sharing is a choice made by
// naming the scope (GlobalScopeName), never the zero value.
func checkScope(scope string) error {
	if strings.TrimSpace(scope) == "" {
		return fmt.Errorf("%w (the key's scope is empty: name whose key it is, such as a tenant or a user, or GlobalScopeName to share one scope deliberately)", ErrScopeMissing)
	}
	return nil
}

// HeaderName is the request header that carries the key
// (draft-ietf-httpapi-idempotency-key-header).
const HeaderName = "Idempotency-Key"

// Errors returned by ParseKeyHeader and ValidateKey. Every error they return
// is a *KeyError that wraps one of these, so callers can use errors.Is.
var (
	// ErrMissingKey means the request carried no Idempotency-Key.
	ErrMissingKey = errors.New("idem: missing Idempotency-Key")
	// ErrInvalidKey means the key was present but malformed.
	ErrInvalidKey = errors.New("idem: invalid Idempotency-Key")
)

// KeyError describes why a key was refused.
type KeyError struct {
	// Reason is a short human explanation, safe to show to clients.
	Reason string
	err    error
}

// Error describes the refusal: the sentinel's text and the reason.
func (e *KeyError) Error() string { return e.err.Error() + ": " + e.Reason }

// Unwrap returns ErrMissingKey or ErrInvalidKey.
func (e *KeyError) Unwrap() error { return e.err }

func invalidKey(format string, args ...any) error {
	return &KeyError{Reason: fmt.Sprintf(format, args...), err: ErrInvalidKey}
}

// ParseKeyHeader extracts the key from the values of the Idempotency-Key
// header (r.Header.Values(idem.HeaderName)).
//
// The value may be a bare token (abc) or an RFC 8941 sf-string ("abc"); both
// mean abc. Exactly one value is allowed: two header lines, or a
// comma-separated list, are refused. The key itself must be 1 to
// MaxKeyLength bytes of visible ASCII (0x21–0x7E).
func ParseKeyHeader(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", &KeyError{Reason: "the request has no Idempotency-Key header", err: ErrMissingKey}
	case 1:
	default:
		return "", invalidKey("the request has %d Idempotency-Key headers; send exactly one", len(values))
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", invalidKey("the Idempotency-Key header is empty")
	}
	if v[0] == '"' {
		s, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		v = s
	} else if strings.IndexByte(v, ',') >= 0 {
		return "", invalidKey("the Idempotency-Key header holds several values; send exactly one")
	}
	if err := ValidateKey(v); err != nil {
		return "", err
	}
	return v, nil
}

// parseSFString decodes an RFC 8941 sf-string: DQUOTE *(unescaped / "\" (DQUOTE / "\")) DQUOTE,
// where unescaped is printable ASCII. Nothing may follow the closing quote.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", invalidKey(`the quoted key has a bad escape; only \" and \\ are allowed`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if rest := strings.Trim(v[i+1:], " \t"); rest != "" {
				if rest[0] == ',' {
					return "", invalidKey("the Idempotency-Key header holds several values; send exactly one")
				}
				return "", invalidKey("unexpected text after the quoted key")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", invalidKey("the quoted key has a byte outside printable ASCII (0x%02x)", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", invalidKey("the quoted key has no closing quote")
}

// ValidateKey checks that key is 1 to MaxKeyLength bytes of visible ASCII.
func ValidateKey(key string) error {
	if key == "" {
		return invalidKey("the key is empty")
	}
	if len(key) > MaxKeyLength {
		return invalidKey("the key is %d bytes long; at most %d are allowed", len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return invalidKey("the key has a byte outside visible ASCII (0x%02x) at offset %d", c, i)
		}
	}
	return nil
}
