package idem

import (
	"context"
	"log/slog"
	"maps"

	"github.com/idem-dev/idem/idemstore"
)

// ErrSealed means a record's answer or request is sealed and could not be
// opened: it was sealed with a key this engine's Sealer does not hold (or
// the engine has none), or it was altered or moved to another record in
// the store. Begin returns it rather than replay such an answer as it is,
// and never runs the operation again; the middleware answers 500 with the
// problem type of SituationSealed.
var ErrSealed = idemstore.ErrSealed

// The engine seals at the edge of the store (EngineConfig.Sealer): what
// goes into Reserve, Complete, a store's CompleteTx and Resolve is sealed
// here, and every record the engine hands out is opened here first.

// sealResponse returns resp as the store should keep it, for key. Without
// a Sealer it is resp itself, except that a header named like the sealed
// marker (which no HTTP answer can carry) is dropped, so that a plain
// answer is never taken for a sealed one.
func (e *Engine) sealResponse(key Key, resp *Response) (*Response, error) {
	if resp != nil {
		if _, ok := resp.Header[idemstore.SealedHeader]; ok {
			h := maps.Clone(resp.Header)
			delete(h, idemstore.SealedHeader)
			resp = &Response{Status: resp.Status, Header: h, Body: resp.Body, NotReplayable: resp.NotReplayable}
		}
	}
	if e.cfg.Sealer == nil {
		return resp, nil
	}
	return e.cfg.Sealer.SealResponse(key, resp)
}

// sealRequest is sealResponse for the request kept for operators.
func (e *Engine) sealRequest(key Key, req *idemstore.Request) (*idemstore.Request, error) {
	if idemstore.IsSealedRequest(req) {
		r := *req
		r.Query = ""
		req = &r
	}
	if e.cfg.Sealer == nil || req == nil {
		return req, nil
	}
	return e.cfg.Sealer.SealRequest(key, req)
}

// sealLabel returns a scope label as the store should keep it: cleaned,
// and sealed when the engine seals. A Sealer that cannot seal labels, or
// that fails to, drops it rather than keep it in clear beside sealed
// answers: a label only ever helps an operator.
func (e *Engine) sealLabel(ctx context.Context, key Key, label string) string {
	label = idemstore.CleanScopeLabel(label)
	if e.cfg.Sealer == nil || label == "" {
		return label
	}
	ls, ok := e.cfg.Sealer.(idemstore.LabelSealer)
	if !ok {
		return ""
	}
	sealed, err := ls.SealLabel(key, label)
	if err != nil {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: a scope label could not be sealed; the record is kept without it",
			digestAttr(key), slog.Any("error", err))
		return ""
	}
	return sealed
}

// open opens rec's sealed parts in place, and logs a record that does not
// open: an operator must restore the key that sealed it.
func (e *Engine) open(ctx context.Context, rec *idemstore.Record) error {
	err := idemstore.OpenRecord(e.cfg.Sealer, rec)
	if err != nil {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: a stored record does not open; it is neither replayed nor run again until the key that sealed it is configured",
			digestAttr(rec.Key), slog.String("state", string(rec.State)), slog.Any("error", err))
	}
	return err
}

// opened opens the record of a Begin result, for every outcome, and
// returns the result, or ErrSealed when the record does not open.
func (e *Engine) opened(ctx context.Context, res Result, err error) (Result, error) {
	if err != nil || res.Record == nil {
		return res, err
	}
	if err := e.open(ctx, res.Record); err != nil {
		res.releaseReplay()
		return Result{}, err
	}
	if res.Outcome == Replayed {
		res.Response = res.Record.Response
		res.keepReplay()
	}
	return res, nil
}
