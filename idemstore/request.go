package idemstore

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// requestCodecV1 is the first byte of an encoded request.
const requestCodecV1 = 1

// ErrCorruptRequest is returned by DecodeRequest for bytes that are not an
// encoded request.
var ErrCorruptRequest = errors.New("idem: corrupt stored request")

// EncodeRequest serialises r into the compact, versioned binary form that
// SQL and Redis drivers keep in one column or field. A nil r encodes as nil.
func EncodeRequest(r *Request) []byte {
	if r == nil {
		return nil
	}
	b := make([]byte, 0, 1+4*binary.MaxVarintLen64+len(r.Method)+len(r.Path)+len(r.Query)+len(r.Body))
	b = append(b, requestCodecV1)
	b = appendString(b, r.Method)
	b = appendString(b, r.Path)
	b = appendString(b, r.Query)
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	return append(b, r.Body...)
}

// DecodeRequest reverses EncodeRequest. Empty input decodes as nil.
func DecodeRequest(b []byte) (*Request, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != requestCodecV1 {
		return nil, fmt.Errorf("%w: unknown format %d", ErrCorruptRequest, b[0])
	}
	d := decoder{b: b[1:]}
	r := &Request{Method: d.string(), Path: d.string(), Query: d.string()}
	if body := d.bytes(); len(body) > 0 {
		r.Body = body
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptRequest, d.err)
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorruptRequest, len(d.b))
	}
	return r, nil
}
