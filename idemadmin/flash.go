package idemadmin

import (
	"crypto/hmac"
	"encoding/base64"
	"net/http"
	"strings"
	"unicode/utf8"
)

// flashCookie carries the message a change leaves for the page it
// redirects to ("Released key …"), which may be served by another
// instance: signed with the session's key and bound to its ID, so that no
// other site, and no other session, can make the page say something.
const flashCookie = "idem_admin_flash"

// setFlash keeps msg for sess's next page.
func (h *Handler) setFlash(w http.ResponseWriter, r *http.Request, sess *session, msg string) {
	msg = cut(msg, 1000)
	sig := mac(sess.key, "flash", sess.id, msg)
	setCookie(w, r, flashCookie, base64.RawURLEncoding.EncodeToString([]byte(msg))+"."+base64.RawURLEncoding.EncodeToString(sig), 300)
}

// takeFlash returns the message left for sess, if any, and clears it.
func (h *Handler) takeFlash(w http.ResponseWriter, r *http.Request, sess *session) string {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	setCookie(w, r, flashCookie, "", -1)
	enc, encSig, ok := strings.Cut(c.Value, ".")
	msg, err1 := base64.RawURLEncoding.DecodeString(enc)
	sig, err2 := base64.RawURLEncoding.DecodeString(encSig)
	if !ok || err1 != nil || err2 != nil || !utf8.Valid(msg) || !hmac.Equal(sig, mac(sess.key, "flash", sess.id, string(msg))) {
		return ""
	}
	return string(msg)
}
