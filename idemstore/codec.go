package idemstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// responseCodecV1 is the first byte of an encoded response. A future format
// gets a new byte; DecodeResponse keeps reading the old ones.
const responseCodecV1 = 1

// maxDecodedHeaders bounds what DecodeResponse accepts, so a corrupted or
// hostile blob cannot make it allocate without limit.
const maxDecodedHeaders = 10000

// EncodeResponse serialises r into the compact, versioned binary form that
// SQL and Redis drivers keep in a single column or field. Bodies are stored
// byte-exact; header names are written in sorted order so that equal
// responses encode equally. A nil r encodes as nil.
func EncodeResponse(r *Response) []byte {
	if r == nil {
		return nil
	}
	// Header names are sorted on the stack for the usual handful of headers.
	names := make([]string, 0, 16)
	// The exact size: a store that keeps the bytes (the memory store) keeps
	// their capacity too.
	size := 1 + uvarintLen(uint64(r.Status)) + stringLen(r.NotReplayable) +
		uvarintLen(uint64(len(r.Body))) + len(r.Body) // not stringLen(string(r.Body)): that copies the body
	for name, values := range r.Header {
		names = append(names, name)
		size += stringLen(name) + uvarintLen(uint64(len(values)))
		for _, v := range values {
			size += stringLen(v)
		}
	}
	size += uvarintLen(uint64(len(names)))
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, responseCodecV1)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = appendString(b, r.NotReplayable)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		values := r.Header[name]
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = appendString(b, v)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	b = append(b, r.Body...)
	return b
}

// uvarintLen is how many bytes binary.AppendUvarint appends for x.
func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// stringLen is how many bytes appendString appends for s.
func stringLen(s string) int { return uvarintLen(uint64(len(s))) + len(s) }

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ErrCorruptResponse is returned by DecodeResponse for bytes that are not an
// encoded response.
var ErrCorruptResponse = errors.New("idem: corrupt stored response")

// DecodeResponse reverses EncodeResponse. Empty input decodes as nil.
//
// It allocates little whatever the number of headers: every header name and
// value is a substring of one string copied from b, and all values share
// one slice.
func DecodeResponse(b []byte) (*Response, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != responseCodecV1 {
		return nil, fmt.Errorf("%w: unknown format %d", ErrCorruptResponse, b[0])
	}
	// First pass: validate, count the values and find where the headers
	// start and end, so that the second pass allocates exactly.
	d := decoder{b: b[1:]}
	d.uvarint()
	d.skip()
	n := d.uvarint()
	if n > maxDecodedHeaders {
		return nil, fmt.Errorf("%w: %d headers", ErrCorruptResponse, n)
	}
	headStart := len(b) - len(d.b)
	var values uint64
	for i := uint64(0); i < n && d.err == nil; i++ {
		d.skip()
		nv := d.uvarint()
		if nv > maxDecodedHeaders || values+nv > maxDecodedHeaders {
			return nil, fmt.Errorf("%w: %d header values", ErrCorruptResponse, values+nv)
		}
		values += nv
		for j := uint64(0); j < nv && d.err == nil; j++ {
			d.skip()
		}
	}
	headEnd := len(b) - len(d.b)
	d.skip()
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorruptResponse, len(d.b))
	}

	// Second pass, over valid input.
	d = decoder{b: b[1:]}
	r := &Response{Status: int(d.uvarint())}
	r.NotReplayable = string(d.bytes())
	d.uvarint()
	head := string(b[headStart:headEnd])
	next := func() string { // the next string, as a substring of head
		l := int(d.uvarint())
		off := len(b) - len(d.b) - headStart
		d.b = d.b[l:]
		return head[off : off+l]
	}
	if n > 0 {
		r.Header = make(http.Header, n)
		all := make([]string, values)
		for i := uint64(0); i < n; i++ {
			name := next()
			nv := d.uvarint()
			vs := all[:nv:nv]
			all = all[nv:]
			for j := range vs {
				vs[j] = next()
			}
			r.Header[name] = vs
		}
	}
	r.Body = d.bytes()
	return r, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad length", ErrCorruptResponse)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: truncated", ErrCorruptResponse)
		return nil
	}
	out := make([]byte, n)
	copy(out, d.b[:n])
	d.b = d.b[n:]
	return out
}

func (d *decoder) string() string { return string(d.bytes()) }

// skip passes over one length-prefixed string.
func (d *decoder) skip() {
	n := d.uvarint()
	if d.err != nil {
		return
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: truncated", ErrCorruptResponse)
		return
	}
	d.b = d.b[n:]
}
