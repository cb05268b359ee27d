package idemadmin

import (
	"fmt"
	"html"
	"html/template"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Visible returns s with every character that would not show as itself
// written as a Go escape: control characters (\n, \x1b), format
// characters such as bidirectional overrides (\u202e), invalid UTF-8
// (\xff), and the backslash itself (\\), so that a key, path or reason
// prints as what it is on a terminal and cannot rewrite the line around it.
func Visible(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	forEachPart(s, func(text string, escaped bool) { b.WriteString(text) }, true)
	return b.String()
}

// visibleHTML is Visible for the review page: the text is HTML-escaped and
// every escape is wrapped in <span class="esc">, so that it stands out
// from ordinary characters (a literal backslash stays as it is).
func visibleHTML(s string) template.HTML {
	if !needsEscape(s) {
		return template.HTML(html.EscapeString(s))
	}
	var b strings.Builder
	forEachPart(s, func(text string, escaped bool) {
		if escaped {
			b.WriteString(`<span class="esc">`)
			b.WriteString(html.EscapeString(text))
			b.WriteString(`</span>`)
			return
		}
		b.WriteString(html.EscapeString(text))
	}, false)
	return template.HTML(b.String())
}

func needsEscape(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f || c == '\\' {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if hidden(r, size) {
			return true
		}
		i += size
	}
	return false
}

// hidden reports a rune that does not show as itself.
func hidden(r rune, size int) bool {
	return (r == utf8.RuneError && size == 1) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) ||
		r == '\u2028' || r == '\u2029'
}

// forEachPart calls emit with the runs of s that show as themselves and,
// separately, the escape of each character that does not. escapeBackslash
// writes a backslash as \\.
func forEachPart(s string, emit func(text string, escaped bool), escapeBackslash bool) {
	start := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var esc string
		switch {
		case r == '\\':
			if escapeBackslash {
				esc = `\\`
			}
		case r == utf8.RuneError && size == 1:
			esc = `\x` + hex2(s[i])
		case r < utf8.RuneSelf && (r < 0x20 || r == 0x7f):
			esc = strconv.QuoteRuneToASCII(r)
			esc = esc[1 : len(esc)-1]
		case r >= utf8.RuneSelf && hidden(r, size):
			esc = strconv.QuoteRuneToASCII(r)
			esc = esc[1 : len(esc)-1]
		}
		if esc != "" {
			if start < i {
				emit(s[start:i], false)
			}
			emit(esc, true)
			start = i + size
		}
		i += size
	}
	if start < len(s) {
		emit(s[start:], false)
	}
}

func hex2(c byte) string {
	const hx = "0123456789abcdef"
	return string([]byte{hx[c>>4], hx[c&0xf]})
}

// VisibleJSON rewrites JSON text so that no character a terminal would act
// on appears raw: encoding/json escapes the controls below U+0020, and
// VisibleJSON escapes the rest that Visible would (DEL, the C1 controls,
// format characters such as bidirectional overrides) as \uXXXX. The result
// is the same JSON value: such characters can only occur inside strings.
// Invalid UTF-8 is left to the encoder, which never emits it.
func VisibleJSON(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		// Below U+0020 only JSON's own whitespace can be raw here.
		if !(r == 0x7f || r >= 0x80 && r != utf8.RuneError && hidden(r, size)) {
			if out != nil {
				out = append(out, b[i:i+size]...)
			}
			i += size
			continue
		}
		if out == nil {
			out = append(make([]byte, 0, len(b)+16), b[:i]...)
		}
		for _, u := range utf16.Encode([]rune{r}) {
			out = fmt.Appendf(out, `\u%04x`, u)
		}
		i += size
	}
	if out == nil {
		return b
	}
	return out
}
