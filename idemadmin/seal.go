package idemadmin

import (
	"fmt"
	"strings"

	"github.com/idem-dev/idem/idemstore"
)

// open opens rec's sealed parts with k.Sealer, for display. A part that
// does not open (the key that sealed it is not configured here) is shown
// by what it keeps in clear (an answer's status; a request's method and
// path), and the returned note says why the rest is missing.
func (k *Keys) open(rec *idemstore.Record) string {
	var notes []string
	if idemstore.IsSealedResponse(rec.Response) {
		part := &idemstore.Record{Key: rec.Key, Response: rec.Response}
		if err := idemstore.OpenRecord(k.Sealer, part); err != nil {
			part.Response = &idemstore.Response{Status: rec.Response.Status}
			notes = append(notes, "answer: "+err.Error())
		}
		rec.Response = part.Response
	}
	if idemstore.IsSealedRequest(rec.Request) {
		part := &idemstore.Record{Key: rec.Key, Request: rec.Request}
		if err := idemstore.OpenRecord(k.Sealer, part); err != nil {
			part.Request = &idemstore.Request{Method: rec.Request.Method, Path: rec.Request.Path}
			notes = append(notes, "request: "+err.Error())
		}
		rec.Request = part.Request
	}
	if idemstore.IsSealedLabel(rec.ScopeLabel) {
		label, err := k.openLabel(rec.Key, rec.ScopeLabel)
		if err != nil {
			notes = append(notes, "scope label: "+err.Error())
		}
		rec.ScopeLabel = label
	}
	return strings.Join(notes, "; ")
}

// openLabel opens a sealed scope label, or returns "" and why not.
func (k *Keys) openLabel(key idemstore.Key, sealed string) (string, error) {
	ls, ok := k.Sealer.(idemstore.LabelSealer)
	if !ok {
		return "", fmt.Errorf("%w: its scope label is sealed, and no key to open it is configured", idemstore.ErrSealed)
	}
	label, err := ls.OpenLabel(key, sealed)
	if err != nil {
		return "", err
	}
	return label, nil
}

// item is newItem of rec, opened.
func (k *Keys) item(rec *idemstore.Record, detail bool) Item {
	note := k.open(rec)
	it := newItem(rec, detail)
	it.Sealed = note
	return it
}

// seal seals an answer an operator stores, as the engine seals the ones
// it stores.
func (k *Keys) seal(key idemstore.Key, resp *idemstore.Response) (*idemstore.Response, error) {
	if k.Sealer == nil || resp == nil {
		return resp, nil
	}
	return k.Sealer.SealResponse(key, resp)
}
