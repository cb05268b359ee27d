package idemadmin

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

//go:embed templates/*.html static/style.css static/admin.js
var assets embed.FS

// maxFormBody bounds a form posted to the review page.
const maxFormBody = 2*MaxAnswerBody + 64<<10

// queuePageSize is how many keys one page of the queue shows.
const queuePageSize = 50

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"vis":    visibleHTML,
		"text":   Visible,
		"lines":  visibleLinesHTML,
		"age":    func(it Item) string { return HumanDuration(it.Age()) },
		"ts":     formatTime,
		"scope":  shortScope,
		"deref":  func(s *string) string { return *s },
		"short":  shortScope,
		"pretty": prettyJSON,
		"clock":  func(t time.Time) string { return t.UTC().Format("15:04:05") },
		"req":    requestText,
		"bodyOf": func(text *string, b64 string, n int) bodyView { return bodyView{Text: text, Base64: b64, Bytes: n} },
		"opurl": func(op string) string {
			return "/?" + url.Values{"state": {string(idemstore.StateNeedsReview)}, "operation": {op}}.Encode()
		},
	}
	pages := map[string]*template.Template{}
	for _, name := range []string{"login", "queue", "detail", "confirm", "error", "bulk"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("idemadmin: page %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// view is what a page template shows.
type view struct {
	Title string
	Who   string // signed in as
	CSRF  string
	Flash string
	Error string

	// The queue, or a search.
	State     string
	States    []stateTab
	Items     []Item
	Next      string
	Order     string
	Search    searchForm
	Searching bool
	// Now is when the page was made, by this server's clock.
	Now time.Time
	// Refresh is how often the page refreshes, in milliseconds.
	Refresh int64
	// Overview is what the review queue's first page opens on.
	Overview *overview

	// A bulk action.
	Bulk *bulkView

	// A key, and the settle form as it was filled in.
	Item *Item
	Form pageForm

	// The confirmation of a change.
	Confirm *confirmation
}

// bodyView is a request or response body as the page shows it.
type bodyView struct {
	Text   *string
	Base64 string
	Bytes  int
}

type stateTab struct {
	Label, URL string
	Current    bool
}

type confirmation struct {
	Title, Text, Button, Action string
	Answer                      *idemstore.Response
}

// pageForm is the settle form's fields, as posted.
type pageForm struct {
	Action, Status, Headers, Body, Note, Attempt string
}

func (h *Handler) pageRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /static/style.css", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, assets, "static/style.css")
	})
	mux.HandleFunc("GET /static/admin.js", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, assets, "static/admin.js")
	})
	mux.HandleFunc("GET /login", h.loginPage)
	mux.HandleFunc("POST /login", h.login)
	mux.HandleFunc("POST /logout", h.signedIn(h.logout))
	mux.HandleFunc("GET /{$}", h.signedIn(h.queue))
	mux.HandleFunc("GET /keys/{id}", h.signedIn(h.detail))
	mux.HandleFunc("POST /keys/{id}/resolve", h.signedIn(h.resolve))
	mux.HandleFunc("POST /keys/{id}/delete", h.signedIn(h.deleteKey))
	mux.HandleFunc("POST /bulk", h.signedIn(h.bulk))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.render(w, http.StatusNotFound, "error", &view{Title: "Not found", Error: "There is no page at " + r.URL.Path + "."})
	})
	return securityHeaders(crossOrigin(mux))
}

// signedIn runs next for a live session; every POST must also carry the
// session's form token.
func (h *Handler) signedIn(next func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, err := h.session(r)
		if err != nil {
			h.cfg.Logger.Warn("admin: a session could not be checked", "path", r.URL.Path, "remote", r.RemoteAddr, "error", err)
			h.render(w, http.StatusServiceUnavailable, "error", &view{Title: "Store unavailable",
				Error: "The store did not answer, so this server cannot check that your session was not signed out; nothing was changed. Try again in a moment."})
			return
		}
		if sess == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			h.render(w, http.StatusUnauthorized, "login", &view{Title: "Sign in", Error: "Your session has ended. Sign in again; nothing was changed."})
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBody)
			if !sess.checkCSRF(r.PostFormValue(csrfField)) {
				h.cfg.Logger.Warn("admin: page change refused: missing or wrong form token", "by", sess.name, "path", r.URL.Path, "remote", r.RemoteAddr)
				h.render(w, http.StatusForbidden, "error", h.base(w, r, sess, "Refused", "This form did not come from this page, or it has expired. Reload the page and try again; nothing was changed."))
				return
			}
		}
		next(w, r, sess)
	}
}

// session returns the live session of r's cookie: signed by a token in
// force, not expired, and not signed out on any instance. It is nil
// without one; an error means the store could not say whether it was
// signed out.
func (h *Handler) session(r *http.Request) (*session, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil, nil
	}
	sess, err := parseSession(c.Value, h.auth.Load().keys, h.cfg.Now())
	switch {
	case errors.Is(err, errSessionExpired):
		return nil, nil
	case err != nil:
		h.cfg.Logger.Warn("admin: session cookie refused", "reason", err.Error(), "path", r.URL.Path, "remote", r.RemoteAddr)
		return nil, nil
	}
	revoked, err := h.revoked.revoked(r.Context(), sess)
	if err != nil || revoked {
		return nil, err
	}
	return sess, nil
}

// base is the view of a page for sess, with the message a redirect left
// for it (which it then clears).
func (h *Handler) base(w http.ResponseWriter, r *http.Request, sess *session, title, errMsg string) *view {
	v := &view{Title: title, Error: errMsg, Now: h.cfg.Now().UTC(), Refresh: h.cfg.RefreshEvery.Milliseconds()}
	if sess != nil {
		v.Who, v.CSRF = sess.name, sess.csrf
		if r.Header.Get("X-Idem-Refresh") == "" { // a page's own refresh leaves the message for the page
			v.Flash = h.takeFlash(w, r, sess)
		}
	}
	return v
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if sess, _ := h.session(r); sess != nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	h.render(w, http.StatusOK, "login", &view{Title: "Sign in"})
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	name, ok, refused := h.signIn(w, r, r.PostFormValue("token"))
	if refused {
		h.render(w, http.StatusTooManyRequests, "login", &view{Title: "Sign in",
			Error: "Too many wrong tokens from your address: wait a minute before you try again."})
		return
	}
	if !ok {
		h.render(w, http.StatusUnauthorized, "login", &view{Title: "Sign in", Error: "That is not an admin token of this proxy. Paste a whole NAME:TOKEN line of its token file, or the token after the colon."})
		return
	}
	// A new sign-in never reuses a session.
	value, _ := newSession(name, h.auth.Load().keys[name], h.cfg.Now(), h.cfg.SessionTTL)
	setCookie(w, r, sessionCookie, value, int(h.cfg.SessionTTL/time.Second))
	h.cfg.Logger.Info("admin: signed in", "by", name, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// signIn checks a token presented by r's client (the sign-in form, the
// API's Bearer token), counting a wrong one against the client's address.
// refused is set, and Retry-After, when the address has used up its
// tries: the token is then not even compared.
func (h *Handler) signIn(w http.ResponseWriter, r *http.Request, presented string) (name string, ok, refused bool) {
	addr, now := clientAddr(r, h.cfg.TrustedProxies, h.cfg.SignInIPv6Prefix), h.cfg.Now()
	if allowed, wait, first := h.limiter.allow(addr, now); !allowed {
		if first {
			h.cfg.Logger.Warn("admin: sign-in refused: too many wrong tokens from this address; refusing it until it regains a try",
				"client", addr, "remote", r.RemoteAddr, "path", r.URL.Path, "retry_after", wait.Round(time.Second).String())
		}
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
		return "", false, true
	}
	if name, ok = h.auth.Load().tokens.match(presented); ok {
		return name, true, false
	}
	left := h.limiter.fail(addr, now)
	h.cfg.Logger.Warn("admin: sign-in refused: wrong token", "client", addr, "remote", r.RemoteAddr, "path", r.URL.Path, "tries_left", left)
	return "", false, false
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request, sess *session) {
	setCookie(w, r, sessionCookie, "", -1)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	if err := h.revoked.revoke(ctx, sess); err != nil {
		h.cfg.Logger.Error("admin: sign-out not recorded in the store: other instances accept the session until it expires",
			"by", sess.name, "expires", sess.expires.UTC(), "error", err)
		h.render(w, http.StatusServiceUnavailable, "login", &view{Title: "Sign in",
			Error: "Signed out of this server, but the store did not record it: other servers of the fleet accept your session until " + formatTime(sess.expires) + ". Sign in and out again when the store is back."})
		return
	}
	h.cfg.Logger.Info("admin: signed out", "by", sess.name)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (h *Handler) detail(w http.ResponseWriter, r *http.Request, sess *session) {
	h.showKey(w, r, h.base(w, r, sess, "", ""), http.StatusOK)
}

// showKey renders the key of r's path with v (its form and error).
func (h *Handler) showKey(w http.ResponseWriter, r *http.Request, v *view, status int) {
	it, err := h.keys.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, v, err)
		return
	}
	v.Item, v.Title = &it, "Key "+Visible(it.Key)
	if v.Form.Action == "" {
		v.Form.Headers = "Content-Type: application/json"
	}
	h.render(w, status, "detail", v)
}

func (h *Handler) resolve(w http.ResponseWriter, r *http.Request, sess *session) {
	form := pageForm{
		Action:  r.PostFormValue("action"),
		Status:  strings.TrimSpace(r.PostFormValue("status")),
		Headers: r.PostFormValue("headers"),
		Body:    r.PostFormValue("body"),
		Note:    r.PostFormValue("note"),
		Attempt: r.PostFormValue("attempt"),
	}
	v := h.base(w, r, sess, "", "")
	v.Form = form
	req, err := form.request()
	var answer *idemstore.Response
	if err == nil {
		answer, err = req.Check()
	}
	if err == nil {
		err = pageAttempt(form.Attempt)
	}
	if err == nil {
		_, err = cleanNote(req.Note)
	}
	if err != nil {
		v.Error = "Not changed: " + asError(err).Detail
		h.showKey(w, r, v, http.StatusBadRequest)
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		c := &confirmation{Action: "/keys/" + r.PathValue("id") + "/resolve", Answer: answer}
		if answer == nil {
			c.Title, c.Button = "release this key?", "Release the key"
			c.Text = "Only if the operation certainly did not happen: the key is deleted, and the client's next retry runs the operation again."
		} else {
			c.Title, c.Button = "store this answer?", "Store the answer"
			c.Text = "Only if the operation happened: every retry with this key gets this answer from now on, and the operation never runs again."
		}
		h.confirm(w, r, v, c, idemstore.StateNeedsReview)
		return
	}
	res, err := h.keys.Resolve(r.Context(), r.PathValue("id"), sess.name, req)
	if err != nil {
		v.Error = "Not changed: " + asError(err).Detail
		h.showKey(w, r, v, asError(err).Status)
		return
	}
	if res.State == "released" {
		h.setFlash(w, r, sess, fmt.Sprintf("Released key %s: the client's next retry runs the operation.", quote(res.Key, 100)))
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	h.setFlash(w, r, sess, fmt.Sprintf("Completed key %s with status %d: every retry gets this answer.", quote(res.Key, 100), answer.Status))
	http.Redirect(w, r, "/keys/"+res.ID, http.StatusSeeOther)
}

func (h *Handler) deleteKey(w http.ResponseWriter, r *http.Request, sess *session) {
	v := h.base(w, r, sess, "", "")
	v.Form = pageForm{Action: ActionDelete, Note: r.PostFormValue("note"), Attempt: r.PostFormValue("attempt")}
	if err := pageAttempt(v.Form.Attempt); err != nil {
		v.Error = "Not changed: " + asError(err).Detail
		h.showKey(w, r, v, http.StatusBadRequest)
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		h.confirm(w, r, v, &confirmation{Action: "/keys/" + r.PathValue("id") + "/delete",
			Title: "delete this key?", Button: "Delete the key",
			Text: "The stored answer is forgotten: the next request with this key runs the operation again."}, idemstore.StateCompleted)
		return
	}
	res, err := h.keys.Delete(r.Context(), r.PathValue("id"), sess.name, DeleteRequest{Note: v.Form.Note, Attempt: v.Form.Attempt})
	if err != nil {
		v.Error = "Not changed: " + asError(err).Detail
		h.showKey(w, r, v, asError(err).Status)
		return
	}
	h.setFlash(w, r, sess, fmt.Sprintf("Deleted key %s: the next request with it runs the operation.", quote(res.Key, 100)))
	http.Redirect(w, r, "/?state=completed", http.StatusSeeOther)
}

// confirm shows the confirmation of a change, which posts the same form
// again with confirm=yes; or, when the key is no longer in state want
// under the attempt the form was filled in for, the key as it is now.
func (h *Handler) confirm(w http.ResponseWriter, r *http.Request, v *view, c *confirmation, want idemstore.State) {
	it, err := h.keys.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		h.fail(w, v, err)
		return
	}
	if it.Attempt != v.Form.Attempt || it.State != string(want) {
		key, _ := ParseKeyID(it.ID)
		wrong, state := idemstore.ErrLeaseLost, want
		if it.State != string(want) {
			wrong, state = idemstore.ErrNotCompleted, idemstore.State(it.State)
			if want == idemstore.StateNeedsReview {
				wrong = idemstore.ErrNotNeedsReview
			}
		}
		e := asError(keyError(key, state, wrong))
		v.Error = "Not changed: " + e.Detail
		v.Item, v.Title = &it, "Key "+Visible(it.Key)
		h.render(w, e.Status, "detail", v)
		return
	}
	v.Item, v.Confirm, v.Title = &it, c, "Confirm"
	h.render(w, http.StatusOK, "confirm", v)
}

// pageAttempt refuses a form of the review page that does not name the
// attempt its page showed: a change made on the page is always fenced to
// what the operator looked at (AnyAttempt is for scripts, through the
// API).
func pageAttempt(attempt string) error {
	if attempt == "" || attempt == AnyAttempt {
		return badRequest("this form does not say which attempt of the key it was filled in for; reload the key's page and try again")
	}
	return nil
}

// request turns the posted form into a ResolveRequest.
func (f pageForm) request() (ResolveRequest, error) {
	req := ResolveRequest{Action: f.Action, Note: f.Note, Attempt: f.Attempt}
	if f.Action != ActionComplete {
		return req, nil
	}
	n, err := strconv.Atoi(f.Status)
	if err != nil {
		return req, fmt.Errorf("status %q is not a number", f.Status)
	}
	req.Status = n
	body := strings.ReplaceAll(f.Body, "\r\n", "\n") // browsers send text areas with CRLF
	req.Body = &body
	for i, line := range strings.Split(strings.ReplaceAll(f.Headers, "\r\n", "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return req, fmt.Errorf("headers, line %d: %q is not 'Name: value'", i+1, line)
		}
		if req.Headers == nil {
			req.Headers = map[string]HeaderValues{}
		}
		name = strings.TrimSpace(name)
		req.Headers[name] = append(req.Headers[name], strings.TrimSpace(value))
	}
	return req, nil
}

// fail renders err as an error page, after v.Error if it is set.
func (h *Handler) fail(w http.ResponseWriter, v *view, err error) {
	e := asError(err)
	if v.Title == "" {
		v.Title = http.StatusText(e.Status)
	}
	if v.Error != "" {
		v.Error += " "
	}
	v.Error += e.Detail
	h.render(w, e.Status, "error", v)
}

func (h *Handler) render(w http.ResponseWriter, status int, page string, v *view) {
	var buf bytes.Buffer
	if err := h.pages[page].ExecuteTemplate(&buf, "layout", v); err != nil {
		h.cfg.Logger.Error("admin: rendering a page failed", "page", page, "error", err)
		http.Error(w, "500 rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// HumanDuration writes d as an operator reads an age: 42s, 5m 3s, 2h 10m,
// 3d 4h. The review page and the CLI show ages this way.
func HumanDuration(d time.Duration) string {
	switch s := int64(d / time.Second); {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm %ds", s/60, s%60)
	case s < 48*3600:
		return fmt.Sprintf("%dh %dm", s/3600, s%3600/60)
	default:
		return fmt.Sprintf("%dd %dh", s/86400, s%86400/3600)
	}
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05 MST")
}
