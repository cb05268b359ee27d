package idemadmin

import (
	"net/http"
)

// Changes made from the review page are protected twice against
// cross-site request forgery: every POST must carry the session's form
// token (a hidden field that another site cannot read), and browsers'
// cross-origin POSTs are refused outright by their Sec-Fetch-Site and
// Origin headers (http.CrossOriginProtection). The session cookie is also
// SameSite=Strict, so another site's page never sends it.

// csrfField names the hidden form field that carries the session's token.
const csrfField = "csrf"

// crossOrigin refuses cross-origin browser requests that change something.
func crossOrigin(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "403 cross-origin request refused: changes are only accepted from the review page itself", http.StatusForbidden)
	}))
	return cop.Handler(next)
}

// securityHeaders keeps the review page out of frames and other sites'
// reach, and out of caches: the one script is the page's own file
// (static/admin.js; no inline script runs), which may only fetch this
// origin; styles and forms stay on this origin.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}
