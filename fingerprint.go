package idem

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"mime"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// FingerprintVersion is the version of the fingerprint algorithm. It is the
// prefix of every fingerprint ("v1:…"), so a later algorithm can coexist with
// records stored under this one.
const FingerprintVersion = "v1"

// FingerprintInput is the meaning of a request, as far as idempotency is
// concerned: a retry must carry the same input.
type FingerprintInput struct {
	// Method is the HTTP method (or any verb); compared case-insensitively.
	Method string
	// Operation is the operation name, as in Key.Operation.
	Operation string
	// Path is the request path. With a route pattern as the operation
	// ("POST /orders/{id}/refund"), it tells one order from another.
	Path string
	// Query is the raw URL query. Parameters are compared by name and value;
	// their order does not matter, the order of repeated names does.
	Query string
	// ContentType decides whether Body is canonicalised as JSON
	// (application/json and any +json type).
	ContentType string
	// Body is the request body.
	Body []byte
}

// FingerprintOptions tune Fingerprint.
type FingerprintOptions struct {
	// ExcludeFields are JSON Pointers (RFC 6901) of body members that do not
	// count, such as client timestamps or trace IDs. Defaults to none.
	ExcludeFields []string

	// IncludeFields, if set, are the only JSON Pointers of body members that
	// count: a change anywhere else in the body leaves the fingerprint as it
	// is. ExcludeFields still apply under them. Defaults to none: the whole
	// body counts.
	IncludeFields []string

	// Key, if set, keys the digest: the fingerprint is then
	// HMAC-SHA-256(Key, SHA-256 digest) and starts "v1k:". A plain
	// fingerprint of a low-entropy body (an amount, a short message) can be
	// matched offline against guesses by whoever reads the store; a keyed
	// one cannot without the key. Every instance sharing a store must use
	// the same key, or retries through another instance get 422.
	Key []byte
}

type fpState struct {
	h      hash.Hash
	buf    []byte
	canon  []byte
	c      canonicalizer
	sum    [sha256.Size]byte
	out    [len(FingerprintVersion) + 2 + 2*sha256.Size]byte
	mac    hash.Hash // HMAC under macKey, reused while the key is the same
	macKey []byte
}

var fpPool = sync.Pool{New: func() any { return &fpState{h: sha256.New()} }}

// Fingerprint returns the versioned SHA-256 digest of in:
// "v1:" followed by 64 hex digits ("v1k:" when FingerprintOptions.Key keys
// it).
//
// A JSON body is canonicalised first (see CanonicalJSON), so member order,
// insignificant whitespace and number spelling do not change the result; a
// body that is not valid JSON is hashed as raw bytes, under a different tag
// so the two can never collide. The only error is a malformed ExcludeFields
// or IncludeFields pointer. With IncludeFields, the digest is of the body's
// included members only.
func Fingerprint(in FingerprintInput, opts FingerprintOptions) (string, error) {
	st := fpPool.Get().(*fpState)
	defer fpPool.Put(st)
	b := appendField(st.buf[:0], FingerprintVersion)
	b = appendUpperField(b, in.Method)
	b = appendField(b, in.Operation)
	b = appendField(b, in.Path)
	b = appendQuery(b, in.Query)

	body := in.Body
	tag := "raw"
	if isJSONContentType(in.ContentType) {
		st.c = canonicalizer{src: in.Body, members: st.c.members[:0], scratch: st.c.scratch[:0]}
		canon, err := canonicalJSONWith(&st.c, st.canon[:0], in.Body, opts.ExcludeFields, opts.IncludeFields)
		st.c.src = nil
		switch {
		case err == nil:
			st.canon = canon
			body, tag = canon, "json"
		case isPointerError(err):
			return "", err
		}
	}
	b = appendField(b, tag)
	b = binary.AppendUvarint(b, uint64(len(body)))
	st.buf = b
	st.h.Reset()
	st.h.Write(b)
	st.h.Write(body)
	st.h.Sum(st.sum[:0])
	n := copy(st.out[:], FingerprintVersion+":")
	if len(opts.Key) > 0 {
		if st.mac == nil || !bytes.Equal(st.macKey, opts.Key) {
			st.macKey = append(st.macKey[:0], opts.Key...)
			st.mac = hmac.New(sha256.New, st.macKey)
		}
		st.mac.Reset()
		st.mac.Write(st.sum[:])
		st.mac.Sum(st.sum[:0])
		n = copy(st.out[:], FingerprintVersion+"k:")
	}
	n += hex.Encode(st.out[n:], st.sum[:])
	if cap(st.canon) > 1<<20 {
		st.canon = nil // do not pin huge buffers in the pool
	}
	return string(st.out[:n]), nil
}

// canonicalJSONWith is CanonicalJSON on a reusable canonicalizer.
func canonicalJSONWith(c *canonicalizer, dst, src []byte, exclude, include []string) ([]byte, error) {
	if len(exclude) > 0 || len(include) > 0 {
		// Field rules are rare; the plain path keeps its allocations low.
		return canonicalJSON(dst, src, exclude, include)
	}
	dst, err := c.value(dst, 0)
	if err == nil {
		c.skipSpace()
		if c.pos != len(src) {
			err = c.fail("trailing data after the JSON value")
		}
	}
	return dst, err
}

type pointerError struct{ error }

func isPointerError(err error) bool {
	_, ok := err.(pointerError)
	return ok
}

func isJSONContentType(ct string) bool {
	if ct == "" {
		return false
	}
	if ct == "application/json" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendUpperField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// appendQuery adds the query parameters sorted by name, keeping the order of
// repeated names. An unparsable query is taken as written.
func appendQuery(b []byte, q string) []byte {
	if q == "" {
		return appendField(b, "")
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return appendField(appendField(b, "raw"), q)
	}
	names := make([]string, 0, len(vals))
	for k := range vals {
		names = append(names, k)
	}
	slices.Sort(names)
	b = appendField(b, "q")
	for _, k := range names {
		b = appendField(b, k)
		vs := vals[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendField(b, v)
		}
	}
	return b
}
