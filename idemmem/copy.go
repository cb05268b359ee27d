package idemmem

import (
	"fmt"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// copyRecord returns a copy of e's record, read at now, with its answer
// decoded, that shares nothing mutable with the store.
func copyRecord(e *entry, now time.Time) *idemstore.Record {
	out := copyHead(e, now)
	if e.resp != nil {
		out.Response = decodeResponse(e.resp)
	}
	return out
}

// copyRecordInline is copyRecord, but an answer longer than inline (when
// positive) is left out: the record says its size instead, for
// ReadResponse (idemstore.ReserveParams.InlineResponse).
func copyRecordInline(e *entry, now time.Time, inline int) *idemstore.Record {
	if inline <= 0 || len(e.resp) <= inline {
		return copyRecord(e, now)
	}
	out := copyHead(e, now)
	out.ResponseSize = int64(len(e.resp))
	return out
}

// copyHead is copyRecord without the answer.
func copyHead(e *entry, now time.Time) *idemstore.Record {
	out := e.rec.view()
	out.ReadAt = now
	if e.req != nil {
		req := *e.req
		req.Body = clone(e.req.Body)
		out.Request = &req
	}
	return &out
}

// decodeResponse decodes an answer the store encoded, into a Response
// that shares nothing with it.
func decodeResponse(b []byte) *idemstore.Response {
	resp, err := idemstore.DecodeResponse(b)
	if err != nil {
		// The store encoded it itself; failing to decode is a bug.
		panic(fmt.Sprintf("idemmem: stored response does not decode: %v", err))
	}
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	return resp
}

// clone copies b; empty stays nil.
func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
