package idem

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"
)

// FingerprintVersion is the version of the fingerprint algorithm. It is the
// prefix of every fingerprint ("v2:…"), so that records stored under an
// earlier version can be told apart (see FingerprintSource.MatchesEarlier).
//
// Version v2 differs from v1 in what it keeps apart: the media type and its
// parameters, and Content-Encoding, count; JSON numbers count as spelled
// (1 and 1.0 differ); JSON members whose names a decoder may take for one
// another (duplicates, or names equal but for case, '_' and '-') keep their
// order; query parameters keep their order. And in what it takes as equal:
// a multipart body's boundary does not count.
const FingerprintVersion = "v2"

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
	// Query is the raw URL query. It counts as written, parameters in
	// their order, except that a percent-encoded unreserved character
	// (%41) is the character (A) and hex digits are compared
	// case-insensitively (RFC 3986, section 6.2.2).
	Query string
	// ContentType is the request's Content-Type (several headers joined
	// by a line feed, as the middleware does, count byte for byte as
	// written). Its media type and parameters count, compared as a parser
	// reads them (case-insensitive type and names, charset value
	// case-insensitive, parameters in any order), except a multipart
	// boundary. It also decides how Body is read: see Fingerprint.
	ContentType string
	// ContentEncoding is the request's Content-Encoding (several values
	// joined by ", "). The codings count, in order; with any coding, Body
	// counts byte for byte.
	ContentEncoding string
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
	// is. ExcludeFields still apply under them. Their names match members
	// as a case-insensitive decoder would (ignoring case, '_' and '-'), so
	// that every member such a decoder reads into an included field
	// counts. Defaults to none: the whole body counts.
	IncludeFields []string

	// Key, if set, keys the digest: the fingerprint is then
	// HMAC-SHA-256(Key, SHA-256 digest) and starts "v2k:". A plain
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
	digest [sha256.Size]byte
	out    [len(FingerprintVersion) + 2 + 2*sha256.Size]byte
	mac    hash.Hash // HMAC under macKey, reused while the key is the same
	macKey []byte
	// A multipart body's boundary, and where it occurs.
	boundary []byte
	at       []int
}

var fpPool = sync.Pool{New: func() any { return &fpState{h: sha256.New()} }}

// Fingerprint returns the versioned SHA-256 digest of in:
// "v2:" followed by 64 hex digits ("v2k:" when FingerprintOptions.Key keys
// it).
//
// Two inputs share a fingerprint only if their method, operation, path,
// query, media type and content coding are the same (as FingerprintInput
// says) and their bodies mean the same to the parser their media type
// calls for:
//
//   - JSON (application/json and any +json type, in UTF-8, with no content
//     coding) is canonicalised (see CanonicalJSON), so member order,
//     insignificant whitespace and string escaping do not count; field
//     rules apply. A body that is not valid JSON counts byte for byte.
//   - multipart/* counts byte for byte except for its boundary, so that a
//     client that draws a new boundary for each retry (curl -F, browsers)
//     still matches. This holds when the boundary is valid (RFC 2046) and
//     occurs only in delimiter lines; otherwise the body and the whole
//     Content-Type, boundary included, count as sent.
//   - Any other body, forms included, counts byte for byte: form parsers
//     disagree on '+', on ';' and on the order of names (Rack's nested
//     parameters), and a retry sends the same bytes.
//
// The only error is a malformed ExcludeFields or IncludeFields pointer.
func Fingerprint(in FingerprintInput, opts FingerprintOptions) (string, error) {
	st := fpPool.Get().(*fpState)
	defer fpPool.Put(st)
	b := appendField(st.buf[:0], FingerprintVersion)
	b = appendUpperField(b, in.Method)
	b = appendField(b, in.Operation)
	b = appendField(b, in.Path)
	b = appendQuery(b, in.Query)
	md := parseMedia(in.ContentType)
	coded := codings(in.ContentEncoding) > 0
	var parts multipartBody
	if md.multipart() && !coded {
		parts, st.boundary = splitMultipart(in.Body, md.param("boundary"), st.at[:0], st.boundary)
		if cap(parts.at) <= 1<<12 {
			st.at = parts.at // kept in the pool
		}
	}
	b = md.append(b, parts.ok)
	b = appendCodings(b, in.ContentEncoding)

	switch {
	case coded: // compressed: the bytes count as sent
	case md.json():
		canon, ok, err := st.canonical(in.Body, opts, false)
		if err != nil {
			return "", err
		}
		if ok {
			return st.sum(b, "json", canon, FingerprintVersion, opts.Key), nil
		}
	case parts.ok:
		b = appendField(b, "multipart")
		st.h.Reset()
		st.h.Write(b)
		parts.write(st.h)
		st.buf = b
		return st.finish(FingerprintVersion, opts.Key), nil
	}
	return st.sum(b, "raw", in.Body, FingerprintVersion, opts.Key), nil
}

// canonical canonicalises body as JSON (in version v1's form with v1) with
// the field rules of opts. ok is false for a body that is not
// canonicalisable JSON; the only error is a malformed field pointer.
func (st *fpState) canonical(body []byte, opts FingerprintOptions, v1 bool) (canon []byte, ok bool, err error) {
	st.c.reset(body)
	st.c.v1 = v1
	canon, err = canonicalJSONWith(&st.c, st.canon[:0], opts.ExcludeFields, opts.IncludeFields)
	st.c.release()
	switch {
	case err == nil:
		st.canon = canon
		return canon, true, nil
	case isPointerError(err):
		return nil, false, err
	}
	return nil, false, nil
}

// sum returns the fingerprint under version of the fields in b, then tag
// and body.
func (st *fpState) sum(b []byte, tag string, body []byte, version string, key []byte) string {
	b = appendField(b, tag)
	b = binary.AppendUvarint(b, uint64(len(body)))
	st.buf = b
	st.h.Reset()
	st.h.Write(b)
	st.h.Write(body)
	return st.finish(version, key)
}

// finish sums st.h, keys it when key is set, and returns the fingerprint
// under version.
func (st *fpState) finish(version string, key []byte) string {
	if cap(st.canon) > 1<<20 {
		st.canon = nil // do not pin huge buffers in the pool
	}
	st.h.Sum(st.digest[:0])
	n := copy(st.out[:], version)
	if len(key) > 0 {
		if st.mac == nil || !bytes.Equal(st.macKey, key) {
			st.macKey = append(st.macKey[:0], key...)
			st.mac = hmac.New(sha256.New, st.macKey)
		}
		st.mac.Reset()
		st.mac.Write(st.digest[:])
		st.mac.Sum(st.digest[:0])
		st.out[n] = 'k'
		n++
	}
	st.out[n] = ':'
	n++
	hexDigest((*[2 * sha256.Size]byte)(st.out[n:]), &st.digest)
	n += 2 * sha256.Size
	return string(st.out[:n])
}

// hexPairs holds the two lower-case hex digits of every byte.
var hexPairs = func() (t [256][2]byte) {
	const digits = "0123456789abcdef"
	for i := range t {
		t[i] = [2]byte{digits[i>>4], digits[i&0xf]}
	}
	return t
}()

// hexDigest writes d in lower-case hex, as hex.Encode does, a table
// look-up per byte.
func hexDigest(dst *[2 * sha256.Size]byte, d *[sha256.Size]byte) {
	for i, v := range d {
		p := hexPairs[v]
		dst[2*i], dst[2*i+1] = p[0], p[1]
	}
}

// canonicalJSONWith is canonicalJSON on a reusable canonicalizer, set up
// for its source.
func canonicalJSONWith(c *canonicalizer, dst []byte, exclude, include []string) ([]byte, error) {
	if len(exclude) > 0 || len(include) > 0 {
		// Field rules are rare; the plain path keeps its allocations low.
		return c.run(dst, exclude, include)
	}
	dst, err := c.value(dst, 0)
	if err == nil {
		c.skipSpace()
		if c.pos != len(c.src) {
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

// appendQuery adds the query as written, with percent-encoded unreserved
// characters decoded and the hex digits of other escapes in upper case
// (RFC 3986, section 6.2.2): every query parser reads those alike. The
// order of parameters counts (Rack reads items[][a]=1&items[][b]=2 and
// items[][b]=2&items[][a]=1 differently), and so does '+' against %20. A
// query with a '%' that does not start an escape is taken as written.
func appendQuery(b []byte, q string) []byte {
	n, ok := normalQueryLen(q)
	if !ok {
		return appendField(appendField(b, "q!"), q)
	}
	b = appendField(b, "q")
	b = binary.AppendUvarint(b, uint64(n))
	for i := 0; i < len(q); i++ {
		if q[i] != '%' {
			b = append(b, q[i])
			continue
		}
		v := unhex(q[i+1])<<4 | unhex(q[i+2])
		if unreserved(v) {
			b = append(b, v)
		} else {
			b = append(b, '%', upperHex[v>>4], upperHex[v&0xf])
		}
		i += 2
	}
	return b
}

const upperHex = "0123456789ABCDEF"

// normalQueryLen returns the length of q normalised by appendQuery, or
// false when a '%' in q does not start an escape.
func normalQueryLen(q string) (int, bool) {
	n := len(q)
	for i := 0; i < len(q); i++ {
		if q[i] != '%' {
			continue
		}
		if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
			return 0, false
		}
		if unreserved(unhex(q[i+1])<<4 | unhex(q[i+2])) {
			n -= 2
		}
		i += 2
	}
	return n, true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// unreserved reports the characters RFC 3986 calls unreserved.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
