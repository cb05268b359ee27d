package idem

import (
	"bytes"
	"encoding/binary"
	"hash"
	"mime"
	"slices"
	"strings"
)

// media is a Content-Type as the fingerprint reads it.
type media struct {
	raw    string // the header as sent, when it does not parse
	bad    bool   // raw counts instead of typ and params
	typ    string // lower-case type/subtype; "" without a Content-Type
	params map[string]string
}

// parseMedia reads a Content-Type. One that mime.ParseMediaType refuses,
// that uses RFC 2231 parameters (name*=, which parsers decode
// differently), or that is several headers, counts as written.
func parseMedia(ct string) media {
	if ct == "" {
		return media{}
	}
	if ct == "application/json" {
		return media{typ: ct}
	}
	if typ, ok := plainMediaType(ct); ok {
		return media{typ: typ}
	}
	// Several Content-Type headers (singletonHeader joins them with a
	// line feed, which mime.ParseMediaType would trim away with an empty
	// one) count as sent, as does an RFC 2231 parameter.
	if strings.IndexByte(ct, '*') >= 0 || strings.IndexByte(ct, '\n') >= 0 {
		return media{raw: ct, bad: true}
	}
	typ, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return media{raw: ct, bad: true}
	}
	return media{typ: typ, params: params}
}

// plainMediaType returns ct in lower case when it is a bare type/subtype
// with no parameters and no spaces, the common case, without allocating
// when it is already lower case.
func plainMediaType(ct string) (string, bool) {
	slash, upper := -1, false
	for i := 0; i < len(ct); i++ {
		c := ct[i]
		switch {
		case c == '/' && slash < 0 && i > 0:
			slash = i
		case 'A' <= c && c <= 'Z':
			upper = true
		case c >= 0x80 || !isTokenChar[c]:
			return "", false
		}
	}
	if slash < 0 || slash == len(ct)-1 {
		return "", false
	}
	if upper {
		return strings.ToLower(ct), true
	}
	return ct, true
}

// isTokenChar reports the characters of an RFC 9110 token.
var isTokenChar = func() (t [128]bool) {
	for c := '!'; c <= '~'; c++ {
		t[c] = !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c)
	}
	return t
}()

func (m media) param(name string) string { return m.params[name] }

// json reports a JSON media type whose bytes are UTF-8: application/json or
// any +json type, with no charset or charset=utf-8. Under another charset
// the same bytes are other characters, so the body is not canonicalised.
func (m media) json() bool {
	if m.bad || (m.typ != "application/json" && !strings.HasSuffix(m.typ, "+json")) {
		return false
	}
	cs, ok := m.params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8")
}

// multipart reports a multipart media type with a boundary.
func (m media) multipart() bool {
	return !m.bad && strings.HasPrefix(m.typ, "multipart/") && m.params["boundary"] != ""
}

// append adds the media type and its parameters, sorted by name, with the
// charset in lower case, and without the boundary when the multipart body
// was read without it (noBoundary). A Content-Type that does not parse is
// added as sent.
func (m media) append(b []byte, noBoundary bool) []byte {
	if m.bad {
		return appendField(appendField(b, "ct!"), m.raw)
	}
	b = appendField(appendField(b, "ct"), m.typ)
	if len(m.params) == 0 {
		return binary.AppendUvarint(b, 0)
	}
	names := make([]string, 0, len(m.params))
	for k := range m.params {
		if k != "boundary" || !noBoundary {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		v := m.params[k]
		if k == "charset" {
			v = strings.ToLower(v)
		}
		b = appendField(appendField(b, k), v)
	}
	return b
}

// codings counts the content codings of a Content-Encoding value.
func codings(ce string) int {
	if ce == "" {
		return 0
	}
	n := 0
	for f := range strings.SplitSeq(ce, ",") {
		if strings.Trim(f, " \t") != "" {
			n++
		}
	}
	return n
}

// appendCodings adds the content codings of a Content-Encoding value, in
// order and in lower case.
func appendCodings(b []byte, ce string) []byte {
	if ce == "" {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(codings(ce)))
	for f := range strings.SplitSeq(ce, ",") {
		if f = strings.Trim(f, " \t"); f != "" {
			b = binary.AppendUvarint(b, uint64(len(f)))
			for i := 0; i < len(f); i++ {
				c := f[i]
				if 'A' <= c && c <= 'Z' {
					c += 'a' - 'A'
				}
				b = append(b, c)
			}
		}
	}
	return b
}

// multipartBody is a multipart body read without its boundary: the bytes
// between the boundary's occurrences, which start at the offsets at.
type multipartBody struct {
	body []byte
	n    int   // the boundary's length
	at   []int // where the boundary occurs
	ok   bool
}

// splitMultipart reads body as a multipart body with boundary, appending
// the offsets of the boundary to at and using buf for the boundary's bytes.
// It is ok when the boundary is valid (RFC 2046: 1 to 70 of its
// characters; here without spaces) and every occurrence of it in body is
// in a delimiter line: at the start of the body or after a CRLF, after "--",
// and followed by "--", by the end of the body, or by spaces and a line
// end.
//
// Then two bodies with the same bytes between those occurrences differ only
// in the boundary string: any multipart parser, strict or lenient, finds
// its delimiters at the same places in both, so it reads the same parts,
// headers and contents. A body for which this cannot be said counts byte
// for byte, under its whole Content-Type.
func splitMultipart(body []byte, boundary string, at []int, buf []byte) (multipartBody, []byte) {
	if !validBoundary(boundary) {
		return multipartBody{at: at}, buf
	}
	buf = append(buf[:0], boundary...)
	p := multipartBody{body: body, n: len(buf), at: at}
	for i := 0; ; {
		j := bytes.Index(body[i:], buf)
		if j < 0 {
			break
		}
		if !delimiterAt(body, i+j, len(buf)) {
			return multipartBody{at: at}, buf
		}
		p.at = append(p.at, i+j)
		i += j + len(buf)
	}
	p.ok = true
	return p, buf
}

// delimiterAt reports whether the boundary of length n found at body[at:]
// is in a delimiter line.
func delimiterAt(body []byte, at, n int) bool {
	// Not at the start of the body, a delimiter follows a CRLF: after one
	// that ends in CRLF, Go's reader takes "\n--boundary" as content, so
	// the boundary would count.
	if at < 2 || body[at-1] != '-' || body[at-2] != '-' || (at > 2 && (at < 4 || body[at-3] != '\n' || body[at-4] != '\r')) {
		return false
	}
	rest := body[at+n:]
	if len(rest) == 0 || bytes.HasPrefix(rest, []byte("--")) {
		return true
	}
	rest = bytes.TrimLeft(rest, " \t")
	return len(rest) > 0 && (rest[0] == '\r' || rest[0] == '\n')
}

// validBoundary reports a boundary that RFC 2046 allows, without spaces:
// a parser that trims the parameter would look for another boundary.
func validBoundary(b string) bool {
	if len(b) == 0 || len(b) > 70 {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || strings.IndexByte("'()+_,-./:=?", c) >= 0) {
			return false
		}
	}
	return true
}

// write hashes the bytes between the boundary's occurrences, each with its
// length before it.
func (p multipartBody) write(h hash.Hash) {
	var n [binary.MaxVarintLen64]byte
	from := 0
	for _, at := range p.at {
		h.Write(binary.AppendUvarint(n[:0], uint64(at-from)))
		h.Write(p.body[from:at])
		from = at + p.n
	}
	h.Write(binary.AppendUvarint(n[:0], uint64(len(p.body)-from)))
	h.Write(p.body[from:])
}

// joinedHeader returns a header's values joined by ", ", as FingerprintInput
// takes them: a request with two Content-Encoding headers then counts both,
// as the one list they are (RFC 9110 §5.3).
func joinedHeader(vs []string) string {
	if len(vs) == 1 {
		return vs[0]
	}
	return strings.Join(vs, ", ")
}

// singletonHeader returns the values of a header that has one value, such
// as Content-Type, joined by a line feed, which no value can hold: two
// Content-Type headers are not the one header "a, b" (a server that reads
// the first takes "a" from the one and "a, b" from the other), so they
// never share a fingerprint.
func singletonHeader(vs []string) string {
	if len(vs) == 1 {
		return vs[0]
	}
	return strings.Join(vs, "\n")
}

// comparedAsSent reports whether Fingerprint takes a body with this
// Content-Type and Content-Encoding byte for byte: neither canonical JSON
// nor a multipart body read without its boundary.
func comparedAsSent(ct, ce string) bool {
	if codings(ce) > 0 {
		return true
	}
	md := parseMedia(ct)
	return !md.json() && !md.multipart()
}
