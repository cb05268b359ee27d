package idemadmin

import (
	"html/template"
	"net/http"
)

// Handler serves the admin API (/api/v1/…, Bearer token) and the review
// page (/, a session cookie after signing in with a token). Mount it on
// the admin listener only: it settles keys.
type Handler struct {
	cfg      Config
	keys     *Keys
	tokens   tokenSet
	sessions *sessions
	pages    map[string]*template.Template
	root     http.Handler
}

// New returns the admin handler for cfg.
func New(cfg Config) (*Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := &Handler{
		cfg:      cfg,
		keys:     &Keys{Store: cfg.Store, Retention: cfg.Retention, Logger: cfg.Logger, OnChange: cfg.OnChange, Sealer: cfg.Sealer},
		tokens:   newTokenSet(cfg.Tokens),
		sessions: newSessions(cfg.SessionTTL, cfg.MaxSessions, cfg.Now),
	}
	var err error
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", h.apiRoutes())
	mux.Handle("/", h.pageRoutes())
	h.root = mux
	return h, nil
}

// ServeHTTP serves the API and the review page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.root.ServeHTTP(w, r) }
