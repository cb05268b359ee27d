package idemadmin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// maxRequestBody bounds a JSON request to the API: an answer of
// MaxAnswerBody bytes, escaped, and its headers.
const maxRequestBody = 4*MaxAnswerBody + 64<<10

type whoKey struct{}

// who returns the name of the token the request was authorized with.
func who(ctx context.Context) string {
	name, _ := ctx.Value(whoKey{}).(string)
	return name
}

// apiRoutes returns the API's routes, behind the Bearer token check.
func (h *Handler) apiRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/keys", h.apiList)
	mux.HandleFunc("GET /api/v1/counts", h.apiCounts)
	mux.HandleFunc("GET /api/v1/keys/{id}", h.apiGet)
	mux.HandleFunc("POST /api/v1/keys/{id}/resolve", h.apiResolve)
	mux.HandleFunc("DELETE /api/v1/keys/{id}", h.apiDelete)
	mux.HandleFunc("POST /api/v1/keys/bulk", h.apiBulk)
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &Error{Status: http.StatusNotFound, Code: CodeNotFound, Detail: fmt.Sprintf("no API endpoint %s %s (see docs/admin-api.md)", r.Method, r.URL.Path)})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := bearer(r)
		if !ok {
			writeError(w, errUnauthorized)
			return
		}
		name, match, refused := h.signIn(w, r, tok)
		switch {
		case refused:
			writeError(w, errTooManyFailures)
			return
		case !match:
			writeError(w, errUnauthorized)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), whoKey{}, name)))
	})
}

func (h *Handler) apiList(w http.ResponseWriter, r *http.Request) {
	lq, err := ParseListQuery(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	page, err := h.keys.List(r.Context(), lq)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

func (h *Handler) apiCounts(w http.ResponseWriter, r *http.Request) {
	c, err := h.keys.Counts(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (h *Handler) apiGet(w http.ResponseWriter, r *http.Request) {
	it, err := h.keys.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, it)
}

func (h *Handler) apiResolve(w http.ResponseWriter, r *http.Request) {
	var req ResolveRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	res, err := h.keys.Resolve(r.Context(), r.PathValue("id"), who(r.Context()), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (h *Handler) apiDelete(w http.ResponseWriter, r *http.Request) {
	var req DeleteRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	// A DELETE may carry its fields in the query instead of a body.
	if req.Note == "" {
		req.Note = r.URL.Query().Get("note")
	}
	if req.Attempt == "" {
		req.Attempt = r.URL.Query().Get("attempt")
	}
	res, err := h.keys.Delete(r.Context(), r.PathValue("id"), who(r.Context()), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (h *Handler) apiBulk(w http.ResponseWriter, r *http.Request) {
	var req BulkRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	res, err := h.keys.Bulk(r.Context(), who(r.Context()), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// decodeJSON reads one JSON object from r's body into v, refusing unknown
// fields (a misspelt "action" must not pass unnoticed). optional accepts
// an empty body.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF) && optional:
		return nil
	case errors.Is(err, io.EOF):
		return badRequest("the request body is empty; send a JSON object")
	case errors.As(err, &tooLarge):
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Detail: fmt.Sprintf("the request body is over %d bytes", maxRequestBody)}
	case err != nil:
		return badRequest("the request body is not the JSON expected: %v", err)
	}
	if dec.More() {
		return badRequest("the request body holds more than one JSON value")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
