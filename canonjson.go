package idem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONDepth bounds nesting so hostile input cannot exhaust the stack.
const maxJSONDepth = 512

var errNotJSON = errors.New("idem: not canonicalisable JSON")

// CanonicalJSON appends to dst the canonical form of the JSON text src that
// fingerprints use: insignificant whitespace removed, strings in one
// escaping (\u0041 and A are the same), object members in a canonical order,
// and everything a decoder could read differently kept as written:
//
//   - Numbers are kept as spelled: 1, 1.0, 1e0 and -0 stay four numbers,
//     because decoders tell them apart (json.Number, integer fields, Python's
//     int and float).
//   - Members whose names a decoder may take for one another keep their
//     order: duplicate names (most decoders keep the last, Go merges
//     objects into a struct, some keep the first or refuse), and names equal
//     but for case, '_' and '-' (encoding/json matches struct fields
//     case-insensitively; encoding/json/v2 with case:ignore and others also
//     ignore '_' and '-'). Other members are sorted, by the folded name.
//
// Members named by the JSON Pointers in exclude (RFC 6901, e.g.
// "/meta/trace") do not count: they are left out, or, when another member
// of the same object has a name a decoder may take for theirs, kept in
// place with the value null, so that their order still counts.
//
// It returns an error for text that is not a single valid JSON value in
// UTF-8 (invalid UTF-8 and unpaired surrogate escapes included), or that
// nests deeper than 512 levels.
func CanonicalJSON(dst, src []byte, exclude []string) ([]byte, error) {
	return canonicalJSON(dst, src, exclude, nil, false)
}

// canonicalJSON is CanonicalJSON that, with include set, keeps only the
// members at or under the JSON Pointers in include (see
// FingerprintOptions.IncludeFields). v1 gives the form of fingerprint
// version v1 instead (see fingerprintV1).
func canonicalJSON(dst, src []byte, exclude, include []string, v1 bool) ([]byte, error) {
	c := canonicalizer{src: src, v1: v1}
	return c.run(dst, exclude, include)
}

// run canonicalises c.src, with the field rules exclude and include, and
// appends the result to dst.
func (c *canonicalizer) run(dst []byte, exclude, include []string) ([]byte, error) {
	var err error
	if c.exclude, err = parsePointers("excluded", exclude); err != nil {
		return dst, err
	}
	if c.include, err = parsePointers("included", include); err != nil {
		return dst, err
	}
	if c.include != nil && !c.v1 {
		c.includeFold = make([][]string, len(c.include))
		for i, p := range c.include {
			c.includeFold[i] = make([]string, len(p))
			for j, t := range p {
				c.includeFold[i][j] = foldName(t)
			}
		}
	}
	c.tracked = c.exclude != nil || c.include != nil
	start := len(dst)
	dst, err = c.value(dst, 0)
	if err == nil {
		c.skipSpace()
		if c.pos != len(c.src) {
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

// member is one object member in the output buffer: its canonical name is
// buf[start:keyEnd], its value buf[keyEnd+1:end]; its folded name is
// c.folds[fold:foldEnd]. dropped members are excluded ones, written with the
// value null.
type member struct {
	prefix             uint64 // the first 8 bytes of the folded name, for a quick order
	start, keyEnd, end int32
	fold, foldEnd      int32
	dropped            bool
}

// maxJSONLen bounds the canonical form, at most three times as long as the
// JSON text ("\t" is written "\u0009"), so that offsets into it fit a
// member's int32 fields. A longer text is not canonicalised.
const maxJSONLen = math.MaxInt32

type canonicalizer struct {
	src         []byte
	pos         int
	v1          bool       // the form of fingerprint version v1
	exclude     [][]string // exact tokens
	include     [][]string // nil: everything counts
	includeFold [][]string // include, folded (not in v1)
	tracked     bool       // exclude or include is set: path is maintained
	path        []string   // only maintained when tracked
	pathFold    []string   // path, folded; only maintained with include
	members     []member   // a stack shared by nested objects
	folds       []byte     // folded member names, a stack like members
	scratch     []byte
	// With findTwins, foldedTwins is set when an object has two members
	// whose names fold alike (duplicates included).
	findTwins, foldedTwins bool
}

// reset prepares a pooled canonicalizer for src, keeping its buffers.
func (c *canonicalizer) reset(src []byte) {
	c.src, c.pos, c.v1 = src, 0, false
	c.exclude, c.include, c.includeFold, c.tracked = nil, nil, nil, false
	c.path, c.pathFold = c.path[:0], c.pathFold[:0]
	c.members, c.folds, c.scratch = c.members[:0], c.folds[:0], c.scratch[:0]
	c.findTwins, c.foldedTwins = false, false
}

// release lets go of the source, and of buffers too big to keep in a pool.
func (c *canonicalizer) release() {
	c.src = nil
	if cap(c.members) > 1<<14 {
		c.members = nil
	}
	if cap(c.folds) > 1<<18 {
		c.folds = nil
	}
	if cap(c.scratch) > 1<<20 {
		c.scratch = nil
	}
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
	if depth == 0 && len(dst)+3*len(c.src) > maxJSONLen {
		return dst, c.fail("JSON text too long to canonicalise")
	}
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
		if c.v1 {
			return c.numberV1(dst)
		}
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
	base, foldBase := len(c.members), len(c.folds)
	region := len(dst)
	rewrite := false // members were dropped: write them again
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
		fold := len(c.folds)
		c.folds = appendFoldedName(c.folds, dst[start+1:keyEnd-1])
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != ':' {
			return dst, c.fail("expected ':' after an object member name")
		}
		c.pos++
		dst = append(dst, ':')
		dropped := false
		if c.tracked {
			name, _ := strconv.Unquote(string(dst[start:keyEnd]))
			c.path = append(c.path, name)
			if c.includeFold != nil {
				c.pathFold = append(c.pathFold, string(c.folds[fold:]))
			}
			dropped = c.dropped()
		}
		dst, err = c.value(dst, depth+1)
		if err != nil {
			return dst, err
		}
		if c.tracked {
			c.path = c.path[:len(c.path)-1]
			if c.includeFold != nil {
				c.pathFold = c.pathFold[:len(c.pathFold)-1]
			}
		}
		switch {
		case dropped && c.v1:
			dst = dst[:start]
			rewrite = true
		case dropped:
			dst = append(dst[:keyEnd+1], "null"...)
			rewrite = true
			fallthrough
		default:
			c.members = append(c.members, member{prefix: foldPrefix(c.folds[fold:]), start: int32(start), keyEnd: int32(keyEnd), end: int32(len(dst)),
				fold: int32(fold), foldEnd: int32(len(c.folds)), dropped: dropped})
		}
		done, err := c.separator('}', "an object")
		if err != nil {
			return dst, err
		}
		if done {
			break
		}
		dst = append(dst, ',')
	}
	ms := c.members[base:]
	if c.order(dst, ms) || rewrite {
		dst = c.rewrite(dst, region, ms, rewrite && !c.v1)
	}
	c.members = c.members[:base]
	c.folds = c.folds[:foldBase]
	return append(dst, '}'), nil
}

// rewrite writes the members ms of the object whose region of dst starts at
// region again, in their order, separated by commas. With dropped, a
// dropped member is left out unless a member whose name folds alike counts
// (then its position tells which of them a decoder reads).
func (c *canonicalizer) rewrite(dst []byte, region int, ms []member, dropped bool) []byte {
	c.scratch = append(c.scratch[:0], dst[region:]...)
	dst = dst[:region]
	if !dropped {
		for i, m := range ms {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, c.scratch[int(m.start)-region:int(m.end)-region]...)
		}
		return dst
	}
	first := true
	for i := 0; i < len(ms); {
		j, counts := i+1, !ms[i].dropped
		for ; j < len(ms) && c.twins(ms[i], ms[j]); j++ {
			counts = counts || !ms[j].dropped
		}
		for _, m := range ms[i:j] {
			if m.dropped && !counts {
				continue
			}
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst = append(dst, c.scratch[int(m.start)-region:int(m.end)-region]...)
		}
		i = j
	}
	return dst
}

// twins reports whether the names of a and b fold alike.
func (c *canonicalizer) twins(a, b member) bool {
	return bytes.Equal(c.folds[a.fold:a.foldEnd], c.folds[b.fold:b.foldEnd])
}

// order sorts the members of one object and reports whether it moved any.
// Version v1 sorted them by name, then by value; members whose names fold
// alike now keep their order, and set c.foldedTwins if c.findTwins.
func (c *canonicalizer) order(buf []byte, ms []member) (moved bool) {
	if c.v1 {
		cmp := func(a, b member) int { return compareMemberV1(buf, a, b) }
		if slices.IsSortedFunc(ms, cmp) {
			return false
		}
		slices.SortFunc(ms, cmp)
		return true
	}
	// Members that fold alike keep their order: they are told apart by
	// where they start, which follows the order they came in.
	cmp := func(a, b member) int {
		if a.prefix != b.prefix {
			if a.prefix < b.prefix {
				return -1
			}
			return 1
		}
		if r := bytes.Compare(c.folds[a.fold:a.foldEnd], c.folds[b.fold:b.foldEnd]); r != 0 {
			return r
		}
		return int(a.start - b.start)
	}
	if moved = !slices.IsSortedFunc(ms, cmp); moved {
		slices.SortFunc(ms, cmp)
	}
	if c.findTwins && !c.foldedTwins {
		for i := 1; i < len(ms); i++ {
			if c.twins(ms[i-1], ms[i]) {
				c.foldedTwins = true
				break
			}
		}
	}
	return moved
}

// foldPrefix returns the first 8 bytes of a folded name, big-endian and
// padded with zeros, which order as the names do where they differ.
func foldPrefix(f []byte) uint64 {
	var p [8]byte
	copy(p[:], f)
	return binary.BigEndian.Uint64(p[:])
}

// foldName is appendFoldedName of a decoded name.
func foldName(name string) string {
	var enc []byte
	enc = appendCanonicalString(enc, name)
	return string(appendFoldedName(nil, enc[1:len(enc)-1]))
}

// appendFoldedName appends the folded form of a member name, given as the
// canonical string without its quotes: '_' and '-' removed, and each letter
// replaced by one representative of its case-folding class, so that names a
// case-insensitive decoder matches to one field fold alike. Escapes in the
// canonical string (\", \\ and \u00XX) are copied as they are.
func appendFoldedName(dst, name []byte) []byte {
	for i := 0; i < len(name); {
		c := name[i]
		switch {
		case c == '\\':
			n := 2
			if i+1 < len(name) && name[i+1] == 'u' {
				n = 6
			}
			n = min(n, len(name)-i)
			dst = append(dst, name[i:i+n]...)
			i += n
		case c == '_' || c == '-':
			i++
		case c < utf8.RuneSelf:
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
		default:
			r, n := utf8.DecodeRune(name[i:])
			dst = utf8.AppendRune(dst, foldRune(r))
			i += n
		}
	}
	return dst
}

// foldRune returns the least rune of r's simple case-folding orbit, which
// is the same for every rune that unicode.SimpleFold (and so
// strings.EqualFold) takes for r. Dotted and dotless I, outside the orbit
// of I, fold as I too: decoders that compare unicode.ToUpper(
// unicode.ToLower(r)) (encoding/json of earlier Go releases) or simple
// upper case (.NET's OrdinalIgnoreCase) read "ıd" and "İD" as "id".
func foldRune(r rune) rune {
	if r == '\u0130' || r == '\u0131' {
		return 'I'
	}
	least := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		least = min(least, f)
	}
	return least
}

// dropped reports whether the value at c.path (at c.pos) does not count:
// it is excluded, or include is set and it is neither at or under an
// included pointer nor on the way to one. Version v1 compared include
// pointers exactly and dropped a scalar on the way to one; names are now
// compared folded (as a case-insensitive decoder would match them), and a
// scalar on the way counts.
func (c *canonicalizer) dropped() bool {
	for _, ex := range c.exclude {
		if slices.Equal(ex, c.path) {
			return true
		}
	}
	if c.include == nil {
		return false
	}
	include, path := c.include, c.path
	if !c.v1 {
		include, path = c.includeFold, c.pathFold
	}
	for _, in := range include {
		if len(in) <= len(path) && slices.Equal(in, path[:len(in)]) {
			return false // at or under an included pointer
		}
	}
	for _, in := range include {
		if len(in) > len(path) && slices.Equal(in[:len(path)], path) {
			if !c.v1 {
				return false
			}
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
			idx := strconv.Itoa(i)
			c.path = append(c.path, idx)
			if c.includeFold != nil {
				c.pathFold = append(c.pathFold, idx)
			}
			excluded = c.dropped()
		}
		var err error
		dst, err = c.value(dst, depth+1)
		if err != nil {
			return dst, err
		}
		if c.tracked {
			c.path = c.path[:len(c.path)-1]
			if c.includeFold != nil {
				c.pathFold = c.pathFold[:len(c.pathFold)-1]
			}
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
					// Decoders read an unpaired surrogate differently
					// (U+FFFD in Go, kept as is in JavaScript and
					// Python): such a string is not canonicalised.
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
		default:
			// Invalid UTF-8 is refused rather than read as U+FFFD, as
			// encoding/json would: two different invalid strings must
			// not become one.
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

// appendCanonicalString appends the canonical JSON encoding of s, which
// must be valid UTF-8.
func appendCanonicalString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for _, r := range s {
		dst = appendCanonicalRune(dst, r)
	}
	return append(dst, '"')
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

// number appends the JSON number at c.pos as it is written, once it is
// checked against the JSON grammar.
func (c *canonicalizer) number(dst []byte) ([]byte, error) {
	s, i := c.src, c.pos
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = skipDigits(s, i)
	default:
		c.pos = i
		return dst, c.fail("bad number")
	}
	if i < len(s) && s[i] == '.' {
		j := skipDigits(s, i+1)
		if j == i+1 {
			c.pos = j
			return dst, c.fail("bad number fraction")
		}
		i = j
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := skipDigits(s, i)
		if j == i {
			c.pos = j
			return dst, c.fail("bad number exponent")
		}
		i = j
	}
	dst = append(dst, s[c.pos:i]...)
	c.pos = i
	return dst, nil
}

func skipDigits(s []byte, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}
