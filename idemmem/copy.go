package idemmem

import "github.com/idem-dev/idem/idemstore"

// recordWithResponse lets copyRecord allocate a record and its response in
// one go.
type recordWithResponse struct {
	rec  idemstore.Record
	resp idemstore.Response
}

// copyRecord returns a deep copy of rec that shares nothing mutable with
// it.
func copyRecord(rec *idemstore.Record) *idemstore.Record {
	if rec.Response == nil {
		out := *rec
		return &out
	}
	both := &recordWithResponse{rec: *rec}
	copyResponseInto(&both.resp, rec.Response)
	both.rec.Response = &both.resp
	return &both.rec
}

// copyResponse returns a deep copy of r.
func copyResponse(r *idemstore.Response) *idemstore.Response {
	if r == nil {
		return nil
	}
	out := new(idemstore.Response)
	copyResponseInto(out, r)
	return out
}

// copyResponseInto makes dst a deep copy of src. A nil body becomes an
// empty one, as it reads back from every other store.
func copyResponseInto(dst, src *idemstore.Response) {
	*dst = *src
	dst.Header = src.Header.Clone()
	dst.Body = make([]byte, len(src.Body))
	copy(dst.Body, src.Body)
}
