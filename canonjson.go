package idem

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONDepth bounds nesting so hostile input cannot exhaust the stack.
const maxJSONDepth = 512

var errNotJSON = errors.New("idem: not canonicalisable JSON")

// CanonicalJSON appends to dst a canonical form of the JSON text src: object
// members sorted by name, insignificant whitespace removed, strings in one
// escaping, and numbers written by value (1, 1.0, 1e0 and 10e-1 are equal).
// Members named by the JSON Pointers in exclude (RFC 6901, e.g. "/meta/trace")
// are left out. Two texts with the same meaning canonicalise equally.
//
// It returns an error for text that is not a single valid JSON value in
// UTF-8, or that nests deeper than 512 levels.
func CanonicalJSON(dst, src []byte, exclude []string) ([]byte, error) {
	return canonicalJSON(dst, src, exclude, nil)
}

// canonicalJSON is CanonicalJSON that, with include set, keeps only the
// members at or under the JSON Pointers in include (see
// FingerprintOptions.IncludeFields).
func canonicalJSON(dst, src []byte, exclude, include []string) ([]byte, error) {
	c := canonicalizer{src: src}
	var err error
	if c.exclude, err = parsePointers("excluded", exclude); err != nil {
		return dst, err
	}
	if c.include, err = parsePointers("included", include); err != nil {
		return dst, err
	}
	c.tracked = c.exclude != nil || c.include != nil
	start := len(dst)
	dst, err = c.value(dst, 0)
	if err == nil {
		c.skipSpace()
		if c.pos != len(src) {
			err = c.fail("trailing data after the JSON value")
		}
	}
	if err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// parsePointers parses JSON Pointers, or returns nil for none. kind names
// them in errors ("excluded").
func parsePointers(kind string, ptrs []string) ([][]string, error) {
	if len(ptrs) == 0 {
		return nil, nil
	}
	out := make([][]string, 0, len(ptrs))
	for _, p := range ptrs {
		toks, err := parsePointerOf(kind, p)
		if err != nil {
			return nil, err
		}
		out = append(out, toks)
	}
	return out, nil
}

// parsePointerOf splits an RFC 6901 JSON Pointer into its unescaped
// tokens; kind names it in errors.
func parsePointerOf(kind, p string) ([]string, error) {
	if p == "" || p[0] != '/' {
		return nil, pointerError{errors.New("idem: " + kind + " field " + strconv.Quote(p) + " is not a JSON Pointer (it must start with /)")}
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		for j := 0; j < len(t); j++ {
			if t[j] != '~' {
				continue
			}
			if j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1') {
				return nil, pointerError{errors.New("idem: " + kind + " field " + strconv.Quote(p) +
					` is not a JSON Pointer ("~" must be followed by 0 or 1: "~0" is "~" and "~1" is "/")`)}
			}
			j++
		}
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks, nil
}

type member struct{ start, keyEnd, end int }

type canonicalizer struct {
	src     []byte
	pos     int
	exclude [][]string
	include [][]string // nil: everything counts
	tracked bool       // exclude or include is set: path is maintained
	path    []string   // only maintained when tracked
	members []member   // a stack shared by nested objects
	scratch []byte
}

func (c *canonicalizer) fail(msg string) error {
	return errors.Join(errNotJSON, errors.New(msg+" at offset "+strconv.Itoa(c.pos)))
}

func (c *canonicalizer) skipSpace() {
	src, i := c.src, c.pos
	for i < len(src) && (src[i] == ' ' || src[i] == '\n' || src[i] == '\t' || src[i] == '\r') {
		i++
	}
	c.pos = i
}

func (c *canonicalizer) value(dst []byte, depth int) ([]byte, error) {
	if depth > maxJSONDepth {
		return dst, c.fail("JSON nested too deeply")
	}
	c.skipSpace()
	if c.pos >= len(c.src) {
		return dst, c.fail("unexpected end of JSON")
	}
	switch ch := c.src[c.pos]; {
	case ch == '{':
		return c.object(dst, depth)
	case ch == '[':
		return c.array(dst, depth)
	case ch == '"':
		return c.str(dst)
	case ch == '-' || (ch >= '0' && ch <= '9'):
		return c.number(dst)
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if bytes.HasPrefix(c.src[c.pos:], []byte(lit)) {
				c.pos += len(lit)
				return append(dst, lit...), nil
			}
		}
		return dst, c.fail("unexpected character")
	}
}

func (c *canonicalizer) object(dst []byte, depth int) ([]byte, error) {
	c.pos++ // {
	dst = append(dst, '{')
	base := len(c.members)
	region := len(dst)
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == '}' {
		c.pos++
		return append(dst, '}'), nil
	}
	for {
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != '"' {
			return dst, c.fail("expected an object member name")
		}
		start := len(dst)
		var err error
		dst, err = c.str(dst)
		if err != nil {
			return dst, err
		}
		keyEnd := len(dst)
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != ':' {
			return dst, c.fail("expected ':' after an object member name")
		}
		c.pos++
		dst = append(dst, ':')
		excluded := false
		if c.tracked {
			name, _ := strconv.Unquote(string(dst[start:keyEnd]))
			c.path = append(c.path, name)
			excluded = c.dropped()
		}
		dst, err = c.value(dst, depth+1)
		if err != nil {
			return dst, err
		}
		if c.tracked {
			c.path = c.path[:len(c.path)-1]
		}
		if excluded {
			dst = dst[:start]
		} else {
			c.members = append(c.members, member{start, keyEnd, len(dst)})
		}
		done, err := c.separator('}', "an object")
		if err != nil {
			return dst, err
		}
		if done {
			break
		}
	}
	ms := c.members[base:]
	sorted := slices.IsSortedFunc(ms, func(a, b member) int { return compareMember(dst, a, b) })
	if !sorted {
		slices.SortFunc(ms, func(a, b member) int { return compareMember(dst, a, b) })
	}
	// Rewrite the region with members in order, separated by commas.
	c.scratch = append(c.scratch[:0], dst[region:]...)
	dst = dst[:region]
	for i, m := range ms {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, c.scratch[m.start-region:m.end-region]...)
	}
	c.members = c.members[:base]
	return append(dst, '}'), nil
}

// compareMember orders members by canonical name, then by canonical value so
// that duplicate names still give one order.
func compareMember(buf []byte, a, b member) int {
	if r := bytes.Compare(buf[a.start:a.keyEnd], buf[b.start:b.keyEnd]); r != 0 {
		return r
	}
	return bytes.Compare(buf[a.keyEnd:a.end], buf[b.keyEnd:b.end])
}

// dropped reports whether the value at c.path (at c.pos) is left out: it is
// excluded, or include is set and it is neither at or under an included
// pointer nor an object or array on the way to one.
func (c *canonicalizer) dropped() bool {
	for _, ex := range c.exclude {
		if slices.Equal(ex, c.path) {
			return true
		}
	}
	if c.include == nil {
		return false
	}
	for _, in := range c.include {
		if len(in) <= len(c.path) && slices.Equal(in, c.path[:len(in)]) {
			return false // at or under an included pointer
		}
	}
	for _, in := range c.include {
		if len(in) > len(c.path) && slices.Equal(in[:len(c.path)], c.path) {
			// On the way to an included pointer: kept if it can hold it.
			c.skipSpace()
			return c.pos >= len(c.src) || (c.src[c.pos] != '{' && c.src[c.pos] != '[')
		}
	}
	return true
}

func (c *canonicalizer) array(dst []byte, depth int) ([]byte, error) {
	c.pos++ // [
	dst = append(dst, '[')
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == ']' {
		c.pos++
		return append(dst, ']'), nil
	}
	for i := 0; ; i++ {
		if i > 0 {
			dst = append(dst, ',')
		}
		start := len(dst)
		excluded := false
		if c.tracked {
			c.path = append(c.path, strconv.Itoa(i))
			excluded = c.dropped()
		}
		var err error
		dst, err = c.value(dst, depth+1)
		if err != nil {
			return dst, err
		}
		if c.tracked {
			c.path = c.path[:len(c.path)-1]
		}
		if excluded {
			// An excluded element still holds its place, so that
			// indexes keep their meaning.
			dst = append(dst[:start], "null"...)
		}
		done, err := c.separator(']', "an array")
		if err != nil {
			return dst, err
		}
		if done {
			return append(dst, ']'), nil
		}
	}
}

// separator consumes what follows a member or an element: a comma, or the
// closing byte of the object or array (done).
func (c *canonicalizer) separator(closing byte, in string) (done bool, err error) {
	c.skipSpace()
	if c.pos >= len(c.src) {
		return false, c.fail("unexpected end of JSON in " + in)
	}
	switch c.src[c.pos] {
	case ',':
		c.pos++
		return false, nil
	case closing:
		c.pos++
		return true, nil
	}
	return false, c.fail("expected ',' or '" + string(closing) + "' in " + in)
}

const hexDigits = "0123456789abcdef"

// plainStringByte reports the bytes a JSON string carries as they are in
// canonical form: printable ASCII other than '"' and '\\'.
var plainStringByte = func() (t [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// str decodes the JSON string at c.pos and appends its canonical encoding:
// only '"', '\\' and control characters are escaped; everything else is
// written as UTF-8.
func (c *canonicalizer) str(dst []byte) ([]byte, error) {
	c.pos++ // opening quote
	dst = append(dst, '"')
	for {
		// Copy the run of bytes that need no escaping in one go.
		src, start, i := c.src, c.pos, c.pos
		for i < len(src) && plainStringByte[src[i]] {
			i++
		}
		c.pos = i
		dst = append(dst, src[start:i]...)
		if c.pos >= len(c.src) {
			return dst, c.fail("unterminated string")
		}
		ch := c.src[c.pos]
		switch {
		case ch == '"':
			c.pos++
			return append(dst, '"'), nil
		case ch == '\\':
			if c.pos+1 >= len(c.src) {
				return dst, c.fail("unterminated escape")
			}
			esc := c.src[c.pos+1]
			c.pos += 2
			var r rune
			switch esc {
			case '"', '\\', '/':
				r = rune(esc)
			case 'b':
				r = '\b'
			case 'f':
				r = '\f'
			case 'n':
				r = '\n'
			case 'r':
				r = '\r'
			case 't':
				r = '\t'
			case 'u':
				var ok bool
				r, ok = c.hex4()
				if !ok {
					return dst, c.fail("bad \\u escape")
				}
				if utf16.IsSurrogate(r) {
					if c.pos+1 < len(c.src) && c.src[c.pos] == '\\' && c.src[c.pos+1] == 'u' {
						c.pos += 2
						r2, ok := c.hex4()
						if !ok {
							return dst, c.fail("bad \\u escape")
						}
						r = utf16.DecodeRune(r, r2)
					} else {
						r = utf8.RuneError
					}
					if r == utf8.RuneError {
						return dst, c.fail("unpaired surrogate in \\u escape")
					}
				}
			default:
				return dst, c.fail("bad escape")
			}
			dst = appendCanonicalRune(dst, r)
		case ch < 0x20:
			return dst, c.fail("control character in string")
		case ch < utf8.RuneSelf:
			dst = appendCanonicalRune(dst, rune(ch))
			c.pos++
		default:
			r, size := utf8.DecodeRune(c.src[c.pos:])
			if r == utf8.RuneError && size <= 1 {
				return dst, c.fail("invalid UTF-8 in string")
			}
			dst = append(dst, c.src[c.pos:c.pos+size]...)
			c.pos += size
		}
	}
}

func (c *canonicalizer) hex4() (rune, bool) {
	if c.pos+4 > len(c.src) {
		return 0, false
	}
	var r rune
	for _, h := range c.src[c.pos : c.pos+4] {
		r <<= 4
		switch {
		case h >= '0' && h <= '9':
			r |= rune(h - '0')
		case h >= 'a' && h <= 'f':
			r |= rune(h - 'a' + 10)
		case h >= 'A' && h <= 'F':
			r |= rune(h - 'A' + 10)
		default:
			return 0, false
		}
	}
	c.pos += 4
	return r, true
}

func appendCanonicalRune(dst []byte, r rune) []byte {
	switch {
	case r == '"' || r == '\\':
		return append(dst, '\\', byte(r))
	case r < 0x20:
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
	default:
		return utf8.AppendRune(dst, r)
	}
}

// number appends the canonical form of the JSON number at c.pos: its
// significant digits without leading or trailing zeros, then "e" and the
// exponent, so equal values compare equal whatever their spelling. Zero is
// "0" (negative zero too).
func (c *canonicalizer) number(dst []byte) ([]byte, error) {
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
	// Significant digits: intPart followed by frac; value = digits × 10^(exp-len(frac)).
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
