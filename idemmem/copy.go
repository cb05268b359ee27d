package idemmem

import (
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

// copyRecord returns a copy of e's record, with its answer decoded, that
// shares nothing mutable with the store.
func copyRecord(e *entry) *idemstore.Record {
	if e.resp == nil {
		out := e.rec
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
	out := e.rec
	out.Response = resp
	return &out
}
