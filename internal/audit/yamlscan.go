package audit

import (
	"bytes"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// A YAML document is measured twice. Before any node tree is built,
// scanYAML reads its tokens (yamlLexer, one pass that keeps nothing but
// its position) and counts the nodes they place, how deeply they nest and
// the pairs of keys of each mapping, as written: that bounds what yaml.v3
// then builds, so that a 30 MB list of "- [a]" or twenty thousand "[" are
// refused at the cost of reading them, not of their tree. After yaml.v3
// has built the tree, countTree counts it again exactly, with every alias
// expanded (a billion-laughs document is a few hundred nodes as written),
// and that count is the one the limits are held to and the budget spends.

// scanLimits are what scanYAML refuses past. A zero limit is no limit.
type scanLimits struct {
	nodes, pairs int64
	depth        int
}

// scanFrame is an open collection: a flow one, or a block one with the
// column of its indicators ("-" or its keys).
type scanFrame struct {
	flow, mapping bool
	col           int
	keys          int64 // a mapping's keys so far
	entry         bool  // flow: the entry being read has content
	colon         bool  // flow: ... and a ':'
	explicit      bool  // a '?' waits for its ':'
	pair          bool  // a flow sequence's entry is a pair: a mapping
}

// scanned is what scanYAML counted: nodes as written (an alias is one),
// pairs of keys (aliases not expanded) and depth.
type scanned struct {
	nodes, pairs int64
	depth        int
}

type yamlScan struct {
	lim scanLimits
	scanned
	block     []scanFrame // open block collections, outermost first
	flow      []scanFrame // open flow collections, outermost first
	openPairs int         // open pairs in flow sequences, a level each
	// doc says a document's root is counted; start says the next token
	// that can begin a node starts one (after "-", "?", ":" or a line
	// break), and keyCol is where the last such node began: a key's
	// column, once its ':' comes.
	doc      bool
	start    bool
	keyCol   int
	lastLine int
}

// scanYAML counts data's nodes as written (aliases count one), the depth
// of its collections and the pairs of keys of its mappings, and returns
// errTooManyNodes, errTooDeep or errTooManyKeys as soon as one passes lim.
// It counts what yaml.v3 builds for a well-formed document, and reads a
// malformed one as far as it goes: yaml.v3 reports what is wrong.
func scanYAML(data []byte, lim scanLimits) (scanned, error) {
	y := &yamlScan{lim: lim, start: true}
	l := &yamlLexer{data: asUTF8(data), scan: y}
	if err := l.run(); err != nil {
		return y.scanned, err
	}
	return y.scanned, y.endDocument(y.lastLine)
}

// blockCol is the column of the innermost open block collection, 0 if
// none: a plain scalar's lines, and a block scalar's, are indented
// deeper.
func (y *yamlScan) blockCol() int {
	if n := len(y.block); n > 0 {
		return y.block[n-1].col
	}
	return 0
}

// token reads the token of kind k at line and col.
func (y *yamlScan) token(k tokKind, line, col int) error {
	if line > y.lastLine && len(y.flow) == 0 {
		y.start = true
	}
	y.lastLine = max(y.lastLine, line)
	if k == tokDocument {
		return y.endDocument(line)
	}
	if !y.doc {
		y.doc = true
		y.nodes++ // the document's root
	}
	if n := len(y.flow); n > 0 {
		return y.flowToken(k, &y.flow[n-1], line)
	}
	switch k {
	case tokEntry:
		y.nodes++ // the entry
		y.start = true
		return y.blockIndicator(col, false, line)
	case tokKey:
		y.nodes += 2 // the key and its value, which may be empty
		y.start = true
		if err := y.blockIndicator(col, true, line); err != nil {
			return err
		}
		y.block[len(y.block)-1].explicit = true
		return y.check(line)
	case tokValue:
		y.start = true
		if n := len(y.block); n > 0 && y.block[n-1].explicit && y.block[n-1].col == col {
			y.block[n-1].explicit = false // the value '?' counted
			return y.check(line)
		}
		y.nodes += 2 // an implicit key and its value
		return y.blockIndicator(y.keyCol, true, line)
	}
	if y.start {
		y.start = false
		y.keyCol = col
	}
	switch k {
	case tokSeqStart, tokMapStart:
		return y.push(scanFrame{flow: true, mapping: k == tokMapStart}, line)
	}
	return nil
}

// flowToken reads a token inside the flow collection f.
func (y *yamlScan) flowToken(k tokKind, f *scanFrame, line int) error {
	switch k {
	case tokComma:
		y.endEntry(f)
		return y.check(line)
	case tokSeqEnd, tokMapEnd:
		y.endEntry(f)
		y.flow = y.flow[:len(y.flow)-1]
		return y.check(line)
	case tokKey:
		y.pairEntry(f)
		f.entry, f.explicit = true, true
		y.nodes += 2 // the key and its value, which may be empty
		return y.check(line)
	case tokValue:
		y.pairEntry(f)
		f.entry, f.colon = true, true
		if !f.explicit {
			y.nodes += 2 // an implicit key and its value
		}
		return y.check(line)
	}
	f.entry = true
	switch k {
	case tokSeqStart, tokMapStart:
		return y.push(scanFrame{flow: true, mapping: k == tokMapStart}, line)
	}
	return nil
}

// endEntry counts what the entry of f that ends holds besides what its
// ':' counted: a sequence's entry is a node (a pair's mapping, if it has
// a ':'), a mapping's entry without a ':' is a key and an empty value.
func (y *yamlScan) endEntry(f *scanFrame) {
	if !f.entry {
		return
	}
	switch {
	case !f.mapping:
		y.nodes++
	case !f.colon && !f.explicit:
		y.nodes += 2
	}
	if f.mapping {
		y.pairs = satAdd(y.pairs, f.keys) // the new key against each before it
		f.keys++
	}
	if f.pair {
		y.openPairs--
	}
	f.entry, f.colon, f.explicit, f.pair = false, false, false, false
}

// pairEntry notes that the entry of f being read is a pair: in a flow
// sequence, a mapping of its own, a level deeper.
func (y *yamlScan) pairEntry(f *scanFrame) {
	if !f.mapping && !f.pair {
		f.pair = true
		y.openPairs++
	}
}

// level is how deeply the collections open here nest.
func (y *yamlScan) level() int {
	return len(y.block) + len(y.flow) + y.openPairs
}

// blockIndicator notes a sequence entry or a mapping key at col: it ends
// the block collections indented deeper, and continues the one at col or
// opens a new one.
func (y *yamlScan) blockIndicator(col int, mapping bool, line int) error {
	for n := len(y.block); n > 0 && y.block[n-1].col > col; n = len(y.block) {
		y.popBlock()
	}
	if n := len(y.block); n > 0 && y.block[n-1].col == col {
		top := &y.block[n-1]
		switch {
		case top.mapping == mapping:
			if mapping {
				y.addKey(top)
			}
			return y.check(line)
		case !mapping:
			// A sequence may sit at its mapping key's column.
		default:
			// A key after such a sequence is its mapping's next key.
			y.popBlock()
			if n := len(y.block); n > 0 && y.block[n-1].col == col && y.block[n-1].mapping {
				y.addKey(&y.block[n-1])
				return y.check(line)
			}
		}
	}
	f := scanFrame{col: col, mapping: mapping}
	if mapping {
		f.keys = 1
	}
	y.block = append(y.block, f)
	return y.check(line)
}

func (y *yamlScan) push(f scanFrame, line int) error {
	y.flow = append(y.flow, f)
	if d := y.level(); y.lim.depth > 0 && d > y.lim.depth {
		return fmt.Errorf("%w: deeper than %d levels (line %d)", errTooDeep, y.lim.depth, line)
	}
	return y.check(line)
}

func (y *yamlScan) popBlock() {
	y.block = y.block[:len(y.block)-1]
}

// addKey notes one more key of the block mapping f: a pair with each key
// before it.
func (y *yamlScan) addKey(f *scanFrame) {
	y.pairs = satAdd(y.pairs, f.keys)
	f.keys++
}

// endDocument closes what is open at the end of a document.
func (y *yamlScan) endDocument(line int) error {
	for len(y.flow) > 0 {
		f := &y.flow[len(y.flow)-1]
		y.endEntry(f)
		y.flow = y.flow[:len(y.flow)-1]
	}
	for len(y.block) > 0 {
		y.popBlock()
	}
	y.doc, y.start = false, true
	return y.check(line)
}

// check reports the first limit passed, at line.
func (y *yamlScan) check(line int) error {
	y.depth = max(y.depth, y.level())
	switch {
	case y.lim.depth > 0 && y.level() > y.lim.depth:
		return fmt.Errorf("%w: deeper than %d levels (line %d)", errTooDeep, y.lim.depth, line)
	case y.lim.nodes > 0 && y.nodes > y.lim.nodes:
		return fmt.Errorf("%w: more than %d nodes (line %d)", errTooManyNodes, y.lim.nodes, line)
	case y.lim.pairs > 0 && y.pairs > y.lim.pairs:
		return fmt.Errorf("%w: its mappings hold more than %d pairs of keys (line %d), which decoders compare to find duplicates", errTooManyKeys, y.lim.pairs, line)
	}
	return nil
}

// asUTF8 is data in UTF-8: yaml.v3 reads UTF-16 too, when a byte order
// mark says so, and the scan must read the characters it reads.
func asUTF8(data []byte) []byte {
	var order func(b []byte) uint16
	switch {
	case bytes.HasPrefix(data, []byte{0xFF, 0xFE}):
		order = func(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }
	case bytes.HasPrefix(data, []byte{0xFE, 0xFF}):
		order = func(b []byte) uint16 { return uint16(b[0])<<8 | uint16(b[1]) }
	default:
		return data
	}
	// Two passes, so that the copy is allocated once, at its size.
	decode := func(emit func(r rune)) {
		for i := 2; i+1 < len(data); i += 2 {
			r := rune(order(data[i:]))
			if utf16.IsSurrogate(r) && i+3 < len(data) {
				if pair := utf16.DecodeRune(r, rune(order(data[i+2:]))); pair != utf8.RuneError {
					r = pair
					i += 2
				}
			}
			emit(r)
		}
	}
	n := 0
	decode(func(r rune) { n += utf8.RuneLen(max(r, 0)) })
	out := make([]byte, 0, n)
	decode(func(r rune) { out = utf8.AppendRune(out, r) })
	return out
}
