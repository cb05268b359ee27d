package idemadmin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A sign-in to the review page is a signed cookie, kept nowhere, so that
// every `idem serve` behind one load balancer accepts it: an operator
// signs in once for the fleet.
//
// The cookie holds the token's name, a random session ID, and when the
// session started and ends, signed with HMAC-SHA256 under a key derived
// from that name's admin token (sessionKey). Every instance that has the
// same token under the same name (the same token file) derives the same
// key and accepts the cookie; an instance, or a fleet, with another token
// for that name refuses it, and so does any instance once the token is
// removed from its token file (a restart, or Handler.SetTokens). The
// cookie never holds the token.
//
// Signing out revokes the session for the whole fleet: the revocation is
// written to the shared store, as a completed record under SessionScope
// that the admin listings never show, and every instance looks for it
// before it accepts a session (revoked).

// sessionCookie names the review page's session cookie.
const sessionCookie = "idem_admin_session"

// sessionVersion starts every session cookie; another version is refused.
const sessionVersion = "v1"

// session is one sign-in to the review page, as its cookie says.
type session struct {
	name    string // the token's name: who acts
	id      string // random, base64url; names the session in its revocation
	csrf    string // the form token every change must carry
	key     []byte // the signing key of name's token
	created time.Time
	expires time.Time
}

// checkCSRF reports whether the form token matches the session's.
func (s *session) checkCSRF(tok string) bool {
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.csrf)) == 1
}

// sessionKey derives the key that signs the sessions of the token tok,
// named name: HMAC-SHA256 keyed by the token, so that the key changes
// with the token and no two names share one.
func sessionKey(name, tok string) []byte {
	return mac([]byte(tok), "idem admin session key v1", name)
}

// mac is HMAC-SHA256 under key of parts, each length-prefixed so that no
// two lists of parts sign the same bytes.
func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// newSession starts a session for name, signed with key, and returns
// its cookie value.
func newSession(name string, key []byte, now time.Time, ttl time.Duration) (string, *session) {
	var id [16]byte
	rand.Read(id[:]) // never fails (crypto/rand)
	s := &session{name: name, id: base64.RawURLEncoding.EncodeToString(id[:]), key: key,
		created: now.Truncate(time.Second), expires: now.Add(ttl).Truncate(time.Second)}
	s.csrf = base64.RawURLEncoding.EncodeToString(mac(key, "csrf", s.id))
	payload := strings.Join([]string{sessionVersion, name, s.id, unix(s.created), unix(s.expires)}, "|")
	return payload + "|" + base64.RawURLEncoding.EncodeToString(mac(key, "session", payload)), s
}

// Why a session cookie is refused, for the log.
var (
	errSessionMalformed = errors.New("malformed session cookie")
	errSessionSignature = errors.New("session cookie not signed by a token of this server (forged, altered, or its token was removed or changed)")
	errSessionExpired   = errors.New("session expired")
)

// parseSession checks a session cookie's value: its form, its signature
// under the key of the token it names (keys holds them by name), and its
// expiry at now. It does not look for a revocation.
func parseSession(value string, keys map[string][]byte, now time.Time) (*session, error) {
	parts := strings.Split(value, "|")
	if len(parts) != 6 || parts[0] != sessionVersion || len(value) > 512 {
		return nil, errSessionMalformed
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[5])
	if err != nil {
		return nil, errSessionMalformed
	}
	name := parts[1]
	// Verify under a key in every case, in constant time, so that the
	// answer does not tell which names exist.
	key, known := keys[name]
	if !known {
		key = unknownNameKey
	}
	payload := value[:len(value)-len(parts[5])-1]
	if !hmac.Equal(sig, mac(key, "session", payload)) || !known {
		return nil, errSessionSignature
	}
	created, err1 := parseUnix(parts[3])
	expires, err2 := parseUnix(parts[4])
	if err1 != nil || err2 != nil || len(parts[2]) != 22 {
		return nil, errSessionMalformed
	}
	if !now.Before(expires) {
		return nil, errSessionExpired
	}
	s := &session{name: name, id: parts[2], key: key, created: created, expires: expires}
	s.csrf = base64.RawURLEncoding.EncodeToString(mac(key, "csrf", s.id))
	return s, nil
}

// unknownNameKey signs nothing: a cookie that names no token is checked
// against it, and refused whatever it matches.
var unknownNameKey = func() []byte {
	var b [32]byte
	rand.Read(b[:])
	return b[:]
}()

// revocationKey names a session's revocation record: its ID's digest.
func (s *session) revocationKey() string {
	sum := sha256.Sum256([]byte(s.id))
	return hex.EncodeToString(sum[:])
}

func unix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

func parseUnix(s string) (time.Time, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, errSessionMalformed
	}
	return time.Unix(n, 0), nil
}

// setCookie sends the session cookie: HttpOnly (no script reads it),
// SameSite=Strict (no other site's page sends it), and Secure over TLS,
// including TLS ended by a proxy in front that says so with
// X-Forwarded-Proto: https (a forged header only makes the cookie
// stricter).
func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name:     name,
		Value:    value,
		Path:     "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"),
		SameSite: http.SameSiteStrictMode,
	})
}

// randomToken returns 32 random bytes in base64url.
func randomToken() string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
