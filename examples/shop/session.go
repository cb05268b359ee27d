package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"

	"github.com/idem-dev/idem"
)

// sessionCookie names the cookie that says who the visitor is. Its value is
// "USER.MAC": a random user ID, set on the first visit, and its HMAC under
// the shop's secret, so that nobody can pick another user's ID and with it
// another user's idempotency keys and orders.
const sessionCookie = "shop_session"

// sessions issues and checks session cookies.
type sessions struct {
	secret []byte
}

// loadSessions reads the cookie secret from the database, making it on the
// first start (insert-first: of two shops starting at once, one secret
// wins and both read it), so that cookies outlive a restart.
func loadSessions(ctx context.Context, db database) (*sessions, error) {
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, err
	}
	if _, err := db.exec(ctx, `INSERT INTO settings (name, value) VALUES ('session_secret', ?) ON CONFLICT (name) DO NOTHING`,
		hex.EncodeToString(fresh)); err != nil {
		return nil, err
	}
	var v string
	if err := db.queryRow(ctx, `SELECT value FROM settings WHERE name = 'session_secret'`).Scan(&v); err != nil {
		return nil, err
	}
	secret, err := hex.DecodeString(v)
	if err != nil || len(secret) < 16 {
		return nil, errors.New("shop: the session secret in settings is malformed")
	}
	return &sessions{secret: secret}, nil
}

func (s *sessions) mac(user string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(user))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// issue makes a new user and the cookie that carries it.
func (s *sessions) issue(r *http.Request) (string, *http.Cookie) {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	user := "u_" + base64.RawURLEncoding.EncodeToString(b)
	return user, &http.Cookie{
		Name: sessionCookie, Value: user + "." + s.mac(user), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil, MaxAge: 365 * 24 * 3600,
	}
}

// user returns the user of r's session cookie: idem.ErrScopeMissing when
// there is none, a *idem.ScopeError when it is forged or malformed.
func (s *sessions) user(r *http.Request) (string, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", idem.ErrScopeMissing
	}
	user, mac, ok := strings.Cut(c.Value, ".")
	if !ok || user == "" || len(user) > 64 || !hmac.Equal([]byte(mac), []byte(s.mac(user))) {
		return "", &idem.ScopeError{Status: http.StatusUnauthorized, Detail: "The session cookie is not one this shop issued; open the shop's page to get a new one."}
	}
	return user, nil
}
