package idemvet

import (
	"go/ast"
	"go/token"
	"strings"

	"golang.org/x/tools/go/analysis"
)

const ignoreDirective = "//idem:ignore"

type ignore struct {
	pos      token.Pos
	reason   string
	trailing bool // after code on its line: it covers that line only
}

// ignores holds the //idem:ignore comments of a package by file and line,
// and the functions whose doc comment holds one.
type ignores struct {
	pass   *analysis.Pass
	byLine map[string]map[int]ignore
	funcs  []span // functions ignored whole
	all    []ignore
}

type span struct{ pos, end token.Pos }

func newIgnores(pass *analysis.Pass, files []*ast.File) *ignores {
	ig := &ignores{pass: pass, byLine: map[string]map[int]ignore{}}
	for _, f := range files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				rest, ok := strings.CutPrefix(c.Text, ignoreDirective)
				if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '\t') {
					continue
				}
				p := pass.Fset.Position(c.Pos())
				if ig.byLine[p.Filename] == nil {
					ig.byLine[p.Filename] = map[int]ignore{}
				}
				i := ignore{pos: c.Pos(), reason: strings.TrimSpace(rest)}
				ig.byLine[p.Filename][p.Line] = i
				ig.all = append(ig.all, i)
			}
		}
		ig.markTrailing(f)
		// An //idem:ignore with a reason in a function's doc comment
		// covers the whole function: routes registered on a mux that the
		// caller wraps, in another package.
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Doc == nil {
				continue
			}
			for _, c := range fd.Doc.List {
				if rest, ok := strings.CutPrefix(c.Text, ignoreDirective+" "); ok && strings.TrimSpace(rest) != "" {
					ig.funcs = append(ig.funcs, span{fd.Pos(), fd.End()})
				}
			}
		}
	}
	return ig
}

// report reports msg at pos unless an //idem:ignore with a reason is on
// that line or the line above, or in the doc comment of the function
// around it.
func (ig *ignores) report(pos token.Pos, msg string) {
	for _, f := range ig.funcs {
		if f.pos <= pos && pos < f.end {
			return
		}
	}
	p := ig.pass.Fset.Position(pos)
	if i, ok := ig.byLine[p.Filename][p.Line]; ok && i.reason != "" {
		return
	}
	if i, ok := ig.byLine[p.Filename][p.Line-1]; ok && i.reason != "" && !i.trailing {
		return
	}
	ig.pass.Report(analysis.Diagnostic{Pos: pos, Message: msg})
}

// markTrailing marks the ignores of f that follow code on their line.
func (ig *ignores) markTrailing(f *ast.File) {
	tf := ig.pass.Fset.File(f.Pos())
	if tf == nil {
		return
	}
	lines := ig.byLine[tf.Name()]
	if len(lines) == 0 {
		return
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n.(type) {
		case nil, *ast.CommentGroup, *ast.Comment:
			return false
		}
		for _, pos := range []token.Pos{n.Pos(), n.End() - 1} {
			line := tf.Line(pos)
			if i, ok := lines[line]; ok && !i.trailing && pos < i.pos {
				i.trailing = true
				lines[line] = i
			}
		}
		return true
	})
}

// reportMissingReasons reports every //idem:ignore that gives no reason:
// it suppresses nothing.
func (ig *ignores) reportMissingReasons() {
	for _, i := range ig.all {
		if i.reason == "" {
			ig.pass.Report(analysis.Diagnostic{Pos: i.pos, Message: "//idem:ignore needs a reason (say why this is safe to run twice); it suppresses nothing without one"})
		}
	}
}
