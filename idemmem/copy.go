package idemmem

import "github.com/idem-dev/idem/idemstore"

// copyRecord returns a deep copy of rec that shares nothing mutable with
// it.
func copyRecord(rec *idemstore.Record) *idemstore.Record {
	out := *rec
	out.Response = copyResponse(rec.Response)
	return &out
}

// copyResponse returns a deep copy of r. A nil body becomes an empty one, as
// it reads back from every other store.
func copyResponse(r *idemstore.Response) *idemstore.Response {
	if r == nil {
		return nil
	}
	out := *r
	out.Header = r.Header.Clone()
	out.Body = make([]byte, len(r.Body))
	copy(out.Body, r.Body)
	return &out
}
