package audit

// tokKind is what a YAML token is, as far as counting nodes goes: an
// indicator that places nodes, or content (a scalar, an anchor, a tag, an
// alias), whose text does not matter.
type tokKind int

const (
	tokContent  tokKind = iota
	tokEntry            // "-", a block sequence's entry
	tokKey              // "?", an explicit key
	tokValue            // ":", a value
	tokComma            // ",", between flow entries
	tokSeqStart         // "["
	tokSeqEnd           // "]"
	tokMapStart         // "{"
	tokMapEnd           // "}"
	tokDocument         // "---" or "...", a document's bounds
)

// yamlLexer reads a YAML stream's tokens in one pass over its bytes,
// holding nothing but its position, and hands each to its scan, which
// tells it in turn how deeply the block collection it is in is indented
// (where a plain scalar's next line and a block scalar's content end). It
// follows the token rules of YAML 1.1 as libyaml reads them (what yaml.v3
// decodes): where a scalar ends is all it needs to find, never what the
// scalar says.
type yamlLexer struct {
	data      []byte
	i         int
	line, col int // of data[i], from 1; col counts characters
	flow      int // open flow collections
	scan      *yamlScan
}

func (l *yamlLexer) run() error {
	l.line, l.col = 1, 1
	for l.i < len(l.data) {
		c := l.data[l.i]
		switch {
		case l.isBreak():
			l.newline()
			continue
		case c == ' ' || c == '\t':
			l.advance()
			continue
		case c == 0xEF && l.has("\xEF\xBB\xBF"):
			l.i += 3 // a byte order mark
			continue
		case c == '#':
			l.skipLine()
			continue
		case l.col == 1 && c == '%':
			l.skipLine() // a directive
			continue
		case l.col == 1 && (l.has("---") || l.has("...")) && l.blankz(l.i+3):
			if err := l.emit(tokDocument); err != nil {
				return err
			}
			l.i += 3
			l.col += 3
			continue
		}
		if err := l.token(c); err != nil {
			return err
		}
	}
	return nil
}

// token reads the token that starts at c.
func (l *yamlLexer) token(c byte) error {
	var kind tokKind
	switch {
	case c == '[':
		kind, l.flow = tokSeqStart, l.flow+1
	case c == '{':
		kind, l.flow = tokMapStart, l.flow+1
	case c == ']' || c == '}':
		kind = tokSeqEnd
		if c == '}' {
			kind = tokMapEnd
		}
		l.flow = max(l.flow-1, 0)
	case c == ',' && l.flow > 0:
		kind = tokComma
	case c == '-' && l.blankz(l.i+1):
		kind = tokEntry
	case c == '?' && (l.flow > 0 || l.blankz(l.i+1)):
		kind = tokKey
	case c == ':' && (l.flow > 0 || l.blankz(l.i+1)):
		kind = tokValue
	default:
		if err := l.emit(tokContent); err != nil {
			return err
		}
		l.content(c)
		return nil
	}
	if err := l.emit(kind); err != nil {
		return err
	}
	l.advance()
	return nil
}

// content skips the content token that starts at c.
func (l *yamlLexer) content(c byte) {
	switch {
	case c == '&' || c == '*':
		// An anchor's name is letters, digits, '_' and '-': what follows
		// it (a ':', a ',') is the next token.
		for l.advance(); l.i < len(l.data) && isAnchorChar(l.data[l.i]); l.advance() {
		}
	case c == '!':
		verbatim := l.i+1 < len(l.data) && l.data[l.i+1] == '<'
		for l.advance(); l.i < len(l.data) && !l.blankz(l.i); l.advance() {
			if verbatim {
				if l.data[l.i] == '>' {
					verbatim = false
				}
				continue
			}
			if isFlowIndicator(l.data[l.i]) {
				return // where yaml.v3 reads on, or fails, this counts more
			}
		}
	case c == '\'' || c == '"':
		l.quoted(c)
	case (c == '|' || c == '>') && l.flow == 0:
		l.blockScalar()
	default:
		l.plain()
	}
}

// quoted skips a quoted scalar: to the quote that closes it (” is a
// quote in a single-quoted one, \ escapes the next character in a
// double-quoted one), across lines.
func (l *yamlLexer) quoted(q byte) {
	l.advance()
	for l.i < len(l.data) {
		c := l.data[l.i]
		switch {
		case l.isBreak():
			l.newline()
		case q == '\'' && c == '\'' && l.i+1 < len(l.data) && l.data[l.i+1] == '\'':
			l.advance()
			l.advance()
		case c == q:
			l.advance()
			return
		case q == '"' && c == '\\' && l.i+1 < len(l.data):
			l.advance()
			if l.isBreak() {
				l.newline()
			} else {
				l.advance()
			}
		default:
			l.advance()
		}
	}
}

// plain skips a plain scalar: to ": ", " #", in a flow collection to a
// flow indicator, and over line breaks while the next line is indented
// deeper than the block collection it is in (any line, in a flow one).
func (l *yamlLexer) plain() {
	indent := l.scan.blockCol() // the scalar's lines start right of it
	for {
		for l.i < len(l.data) && !l.blankz(l.i) {
			c := l.data[l.i]
			if c == ':' && l.blankz(l.i+1) || l.flow > 0 && (c == ',' || c == '?' || c == '[' || c == ']' || c == '{' || c == '}') {
				return
			}
			l.advance()
		}
		// Blanks, and line breaks if the next line goes on.
		mark := *l
		broke := false
		for l.i < len(l.data) && (l.data[l.i] == ' ' || l.data[l.i] == '\t' || l.isBreak()) {
			if l.isBreak() {
				l.newline()
				broke = true
			} else {
				l.advance()
			}
		}
		switch {
		case l.i >= len(l.data),
			l.data[l.i] == '#',
			broke && l.flow == 0 && l.col <= indent,
			l.col == 1 && (l.has("---") || l.has("...")) && l.blankz(l.i+3):
			*l = mark
			return
		}
	}
}

// blockScalar skips a literal or folded scalar: its header line, then
// every line indented at least as deeply as its content (given by the
// header, or by its first line that is not empty), and empty lines.
func (l *yamlLexer) blockScalar() {
	parent := l.scan.blockCol() - 1 // libyaml's indent: from 0, -1 at the top
	indent := 0
	for l.advance(); l.i < len(l.data) && !l.blankz(l.i); l.advance() {
		if c := l.data[l.i]; c >= '1' && c <= '9' {
			indent = max(parent, 0) + int(c-'0')
			if parent < 0 {
				indent = int(c - '0')
			}
		}
	}
	l.skipLine() // blanks, a comment
	if l.i >= len(l.data) {
		return
	}
	l.newline()
	if indent == 0 {
		// The first line that is not empty sets it, and no empty line
		// before it may be deeper.
		deepest, pos := 0, *l
		for pos.i < len(pos.data) {
			spaces := 0
			for pos.i+spaces < len(pos.data) && pos.data[pos.i+spaces] == ' ' {
				spaces++
			}
			deepest = max(deepest, spaces)
			pos.i += spaces
			pos.col += spaces
			if !pos.isBreak() {
				break
			}
			pos.newline()
		}
		indent = max(deepest, parent+1, 1)
	}
	for l.i < len(l.data) {
		spaces := 0
		for l.i+spaces < len(l.data) && l.data[l.i+spaces] == ' ' {
			spaces++
		}
		j := l.i + spaces
		if spaces < indent && j < len(l.data) && !l.isBreakAt(j) {
			return // a line indented less: the scalar has ended
		}
		l.i, l.col = j, l.col+spaces
		l.skipLine()
		if l.i < len(l.data) {
			l.newline()
		}
	}
}

// emit hands the token starting here to the scan.
func (l *yamlLexer) emit(k tokKind) error {
	return l.scan.token(k, l.line, l.col)
}

// skipLine moves to the line break that ends this line.
func (l *yamlLexer) skipLine() {
	for l.i < len(l.data) && !l.isBreak() {
		l.advance()
	}
}

// advance moves past one byte; a column is a character, so a UTF-8
// continuation byte adds none.
func (l *yamlLexer) advance() {
	l.i++
	if l.i < len(l.data) && l.data[l.i]&0xC0 == 0x80 {
		return
	}
	l.col++
}

// newline moves past the line break here.
func (l *yamlLexer) newline() {
	switch {
	case l.has("\r\n"):
		l.i += 2
	case l.data[l.i] == '\r' || l.data[l.i] == '\n':
		l.i++
	case l.data[l.i] == 0xC2:
		l.i += 2 // NEL
	default:
		l.i += 3 // LS, PS
	}
	l.line++
	l.col = 1
}

// isBreak says whether a line break starts here: CR, LF, and as YAML 1.1
// has them (and libyaml), NEL, LS and PS.
func (l *yamlLexer) isBreak() bool { return l.isBreakAt(l.i) }

func (l *yamlLexer) isBreakAt(i int) bool {
	if i >= len(l.data) {
		return false
	}
	switch d := l.data[i:]; {
	case d[0] == '\r' || d[0] == '\n':
		return true
	case len(d) >= 2 && d[0] == 0xC2 && d[1] == 0x85:
		return true
	case len(d) >= 3 && d[0] == 0xE2 && d[1] == 0x80 && (d[2] == 0xA8 || d[2] == 0xA9):
		return true
	}
	return false
}

// blankz says whether i is a blank, a line break or the end.
func (l *yamlLexer) blankz(i int) bool {
	return i >= len(l.data) || l.data[i] == ' ' || l.data[i] == '\t' || l.isBreakAt(i)
}

func (l *yamlLexer) has(s string) bool {
	return len(l.data)-l.i >= len(s) && string(l.data[l.i:l.i+len(s)]) == s
}

func isAnchorChar(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '_' || c == '-'
}

func isFlowIndicator(c byte) bool {
	return c == ',' || c == '[' || c == ']' || c == '{' || c == '}'
}
