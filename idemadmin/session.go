package idemadmin

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"
)

// sessionCookie names the review page's session cookie. Its value is a
// random session ID, never the token: the session lives in this process
// (keyed by the ID's SHA-256), so signing out or its expiry ends it for
// good, whoever still holds the cookie.
const sessionCookie = "idem_admin_session"

// session is one sign-in to the review page.
type session struct {
	name    string // the token's name: who acts
	csrf    string // the form token every change must carry
	created time.Time
	expires time.Time

	mu    sync.Mutex
	flash string // a message for the next page shown
}

// setFlash keeps msg for the next page.
func (s *session) setFlash(msg string) {
	s.mu.Lock()
	s.flash = msg
	s.mu.Unlock()
}

// takeFlash returns the pending message and forgets it.
func (s *session) takeFlash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flash
	s.flash = ""
	return f
}

// checkCSRF reports whether the form token matches the session's.
func (s *session) checkCSRF(tok string) bool {
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.csrf)) == 1
}

// sessions are the review page's live sign-ins.
type sessions struct {
	mu   sync.Mutex
	byID map[[sha256.Size]byte]*session
	ttl  time.Duration
	max  int
	now  func() time.Time
}

func newSessions(ttl time.Duration, max int, now func() time.Time) *sessions {
	return &sessions{byID: map[[sha256.Size]byte]*session{}, ttl: ttl, max: max, now: now}
}

// create starts a session for name and returns its cookie value.
func (s *sessions) create(name string) (string, *session) {
	id, csrf := randomString(), randomString()
	now := s.now()
	sess := &session{name: name, csrf: csrf, created: now, expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byID) >= s.max {
		s.evictLocked(now)
	}
	s.byID[sha256.Sum256([]byte(id))] = sess
	return id, sess
}

// evictLocked drops expired sessions and, if none were, the oldest.
func (s *sessions) evictLocked(now time.Time) {
	var oldestID [sha256.Size]byte
	var oldest *session
	for id, sess := range s.byID {
		if !now.Before(sess.expires) {
			delete(s.byID, id)
			continue
		}
		if oldest == nil || sess.created.Before(oldest.created) {
			oldestID, oldest = id, sess
		}
	}
	if len(s.byID) >= s.max && oldest != nil {
		delete(s.byID, oldestID)
	}
}

// lookup returns the live session of r's cookie, or nil.
func (s *sessions) lookup(r *http.Request) *session {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil
	}
	key := sha256.Sum256([]byte(c.Value))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.byID[key]
	if sess == nil {
		return nil
	}
	if !s.now().Before(sess.expires) {
		delete(s.byID, key)
		return nil
	}
	return sess
}

// end ends the session of r's cookie, if any.
func (s *sessions) end(r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.mu.Lock()
		delete(s.byID, sha256.Sum256([]byte(c.Value)))
		s.mu.Unlock()
	}
}

// setCookie sends the session cookie: HttpOnly (no script reads it),
// SameSite=Strict (no other site's page sends it), and Secure over TLS,
// including TLS ended by a proxy in front that says so with
// X-Forwarded-Proto: https (a forged header only makes the cookie
// stricter).
func setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    value,
		Path:     "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"),
		SameSite: http.SameSiteStrictMode,
	})
}

// randomString returns 32 random bytes in base64url.
func randomString() string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
