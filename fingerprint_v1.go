package idem

import (
	"bytes"
	"encoding/binary"
	"mime"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// FingerprintSource is what a fingerprint was made of. Given as
// Request.FingerprintSource, it lets the engine recognise a record whose
// fingerprint an earlier version of the algorithm made (see MatchesEarlier),
// so that a retry that spans an upgrade of idem is not taken for a
// different request.
type FingerprintSource struct {
	Input   FingerprintInput
	Options FingerprintOptions
}

// MatchesEarlier reports whether stored, a fingerprint made by version v1
// of the algorithm ("v1:" or "v1k:"), is the one v1 makes of s.Input: the
// record was then reserved by this request or by one that v1 could not
// tell from it. It is false for a fingerprint of any other version, and
// false for the requests that v1 is known to confuse with requests that
// mean something else:
//
//   - a JSON body in which two members of one object have names that fold
//     alike (duplicates, or names equal but for case, '_' and '-'): v1
//     sorted them by value, so {"amount":1,"amount":1000} and
//     {"amount":1000,"amount":1} had one fingerprint;
//   - a multipart body with a line starting "--" that is not a delimiter of
//     its own boundary: v1 did not count the Content-Type, so the same bytes
//     read with another boundary had the same fingerprint.
//
// Those get a Mismatch (422) on a record stored by v1, the safe error. For
// every other request a v1 record still matches as it did under v1, which
// did not count the media type, the content coding, nor the spelling of a
// JSON number (1 and 1.0): until the last v1 record expires (the retention),
// a key reused with the same bytes under another Content-Type, or with a
// number spelled another way, gets the first request's answer, as it did
// before the upgrade. That is preferred to a false 422 on an honest retry,
// after which a client may send the request again under a new key.
func (s *FingerprintSource) MatchesEarlier(stored string) bool {
	if s == nil || !strings.HasPrefix(stored, "v1:") && !strings.HasPrefix(stored, "v1k:") {
		return false
	}
	fp, err := fingerprintV1(s.Input, s.Options)
	return err == nil && fp == stored && !v1Confuses(s.Input)
}

// v1Confuses reports a request whose v1 fingerprint is shared by requests
// that mean something else (see MatchesEarlier).
func v1Confuses(in FingerprintInput) bool {
	if isJSONContentType(in.ContentType) {
		c := canonicalizer{src: in.Body, findTwins: true}
		_, err := c.run(nil, nil, nil)
		return err == nil && c.foldedTwins
	}
	md := parseMedia(in.ContentType)
	if !strings.HasPrefix(md.typ, "multipart/") && !strings.HasPrefix(strings.ToLower(strings.TrimSpace(md.raw)), "multipart/") {
		return false
	}
	boundary := []byte(md.param("boundary"))
	if len(boundary) == 0 {
		return true
	}
	for line := range bytes.Lines(in.Body) {
		if bytes.HasPrefix(line, []byte("--")) && !(bytes.HasPrefix(line[2:], boundary) && delimiterAt(line, 2, len(boundary))) {
			return true
		}
	}
	return false
}

// fingerprintV1 is the fingerprint of version v1, as v1 made it: method,
// operation, path, query parameters sorted by name, and a body
// canonicalised as JSON when the Content-Type is a JSON type (whatever its
// parameters), hashed raw otherwise.
func fingerprintV1(in FingerprintInput, opts FingerprintOptions) (string, error) {
	st := fpPool.Get().(*fpState)
	defer fpPool.Put(st)
	b := appendField(st.buf[:0], "v1")
	b = appendUpperField(b, in.Method)
	b = appendField(b, in.Operation)
	b = appendField(b, in.Path)
	b = appendQueryV1(b, in.Query)

	if isJSONContentType(in.ContentType) {
		canon, ok, err := st.canonical(in.Body, opts, true)
		if err != nil {
			return "", err
		}
		if ok {
			return st.sum(b, "json", canon, "v1", opts.Key), nil
		}
	}
	return st.sum(b, "raw", in.Body, "v1", opts.Key), nil
}

// isJSONContentType reports a JSON media type (application/json or any
// +json type), whatever its parameters.
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

// appendQueryV1 adds the query parameters sorted by name, keeping the order
// of repeated names (version v1). An unparsable query is taken as written.
func appendQueryV1(b []byte, q string) []byte {
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

// compareMemberV1 orders members by canonical name, then by canonical value
// (version v1).
func compareMemberV1(buf []byte, a, b member) int {
	if r := bytes.Compare(buf[a.start:a.keyEnd], buf[b.start:b.keyEnd]); r != 0 {
		return r
	}
	return bytes.Compare(buf[a.keyEnd:a.end], buf[b.keyEnd:b.end])
}

// numberV1 appends the number at c.pos as version v1 wrote it: its
// significant digits without leading or trailing zeros, then "e" and the
// exponent, so that 1, 1.0 and 1e0 were one number. Zero is "0" (negative
// zero too).
func (c *canonicalizer) numberV1(dst []byte) ([]byte, error) {
	s := c.src
	i := c.pos
	neg := false
	if s[i] == '-' {
		neg = true
		i++
	}
	intStart := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intPart := s[intStart:i]
	if len(intPart) == 0 || (len(intPart) > 1 && intPart[0] == '0') {
		c.pos = i
		return dst, c.fail("bad number")
	}
	var frac []byte
	if i < len(s) && s[i] == '.' {
		i++
		fs := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		frac = s[fs:i]
		if len(frac) == 0 {
			c.pos = i
			return dst, c.fail("bad number fraction")
		}
	}
	exp := int64(0)
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		es := i
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		ds := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if ds == i {
			c.pos = i
			return dst, c.fail("bad number exponent")
		}
		e, err := strconv.ParseInt(string(s[es:i]), 10, 64)
		if err != nil || e > 1<<40 || e < -(1<<40) {
			c.pos = i
			return dst, c.fail("number exponent out of range")
		}
		exp = e
	}
	c.pos = i
	exp -= int64(len(frac))
	lead := 0
	digits := len(intPart) + len(frac)
	at := func(k int) byte {
		if k < len(intPart) {
			return intPart[k]
		}
		return frac[k-len(intPart)]
	}
	for lead < digits && at(lead) == '0' {
		lead++
	}
	if lead == digits {
		return append(dst, '0'), nil
	}
	end := digits
	for at(end-1) == '0' {
		end--
		exp++
	}
	if neg {
		dst = append(dst, '-')
	}
	for k := lead; k < end; k++ {
		dst = append(dst, at(k))
	}
	if exp != 0 {
		dst = append(dst, 'e')
		dst = strconv.AppendInt(dst, exp, 10)
	}
	return dst, nil
}
