// Package urlpath normalises the escaped paths of request URLs, so that
// spellings a server reads as one path ("/pay", "/%70ay", "/./pay") are
// one string: idem keys operations by it (RFC 3986 §6.2.2).
package urlpath

import "strings"

// Options choose the normalisations beyond RFC 3986's.
type Options struct {
	// MergeSlashes makes runs of '/' one, as nginx and Go's ServeMux do.
	MergeSlashes bool
	// DecodeSlashes decodes %2F to '/' first; otherwise it stays encoded,
	// apart from '/'.
	DecodeSlashes bool
	// StripParams removes each segment's ';' parameters, as Java servlet
	// containers do.
	StripParams bool
}

// Normalize returns the escaped path p normalised: percent-encoded
// unreserved characters decoded and the other escapes' hex digits
// upper-cased, then, as o says, parameters stripped and runs of '/'
// merged, then dot segments removed (RFC 3986 §5.2.4). A path that does
// not start with '/' is returned unchanged.
func Normalize(p string, o Options) string {
	if p == "" || p[0] != '/' || plainPath(p, o) {
		return p
	}
	b := make([]byte, 0, len(p))
	// Percent-encodings: unreserved decoded, the rest upper-cased.
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' && i+2 < len(p) && ishex(p[i+1]) && ishex(p[i+2]) {
			d := unhex(p[i+1])<<4 | unhex(p[i+2])
			if unreserved(d) || (d == '/' && o.DecodeSlashes) {
				b = append(b, d)
			} else {
				b = append(b, '%', upperHex(p[i+1]), upperHex(p[i+2]))
			}
			i += 2
			continue
		}
		b = append(b, c)
	}
	if o.StripParams {
		b = stripParams(b)
	}
	if o.MergeSlashes {
		b = MergeSlashes(b)
	}
	return removeDotSegments(string(b))
}

// plainPath reports whether p needs no normalising: the usual case, checked
// without allocating.
func plainPath(p string, o Options) bool {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '%':
			return false
		case ';':
			if o.StripParams {
				return false
			}
		case '/':
			if i+1 < len(p) && (p[i+1] == '.' || (p[i+1] == '/' && o.MergeSlashes)) {
				return false
			}
		}
	}
	return true
}

// stripParams removes, from each segment of the path b, what follows its
// first ';'.
func stripParams(b []byte) []byte {
	out := b[:0]
	skip := false
	for _, c := range b {
		switch {
		case c == '/':
			skip = false
		case c == ';':
			skip = true
		}
		if !skip {
			out = append(out, c)
		}
	}
	return out
}

// MergeSlashes makes every run of '/' in b one.
func MergeSlashes(b []byte) []byte {
	out := b[:0]
	for i, c := range b {
		if c == '/' && i > 0 && b[i-1] == '/' {
			continue
		}
		out = append(out, c)
	}
	return out
}

// removeDotSegments is RFC 3986 §5.2.4's algorithm for a path that starts
// with '/'.
func removeDotSegments(in string) string {
	if !strings.Contains(in, "/.") {
		return in
	}
	out := make([]string, 0, strings.Count(in, "/"))
	segs := strings.Split(in[1:], "/")
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}
