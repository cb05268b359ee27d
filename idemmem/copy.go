package idemmem

import (
	"fmt"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// copyRecord returns a copy of e's record, read at now, with its answer
// decoded, that shares nothing mutable with the store.
func copyRecord(e *entry, now time.Time) *idemstore.Record {
	out := e.rec.view()
	out.ReadAt = now
	if e.req != nil {
		req := *e.req
		req.Body = clone(e.req.Body)
		out.Request = &req
	}
	if e.resp == nil {
		return &out
	}
	resp, err := idemstore.DecodeResponse(e.resp)
	if err != nil {
		// The store encoded it itself; failing to decode is a bug.
		panic(fmt.Sprintf("idemmem: stored response does not decode: %v", err))
	}
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	out.Response = resp
	return &out
}

// clone copies b; empty stays nil.
func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
