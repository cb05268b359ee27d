package idemvet

import (
	"go/ast"
	"go/token"
	"strings"

	"golang.org/x/tools/go/analysis"
)

const ignoreDirective = "//idem:ignore"

type ignore struct {
	pos    token.Pos
	reason string
}

// ignores holds the //idem:ignore comments of a package by file and line.
type ignores struct {
	pass   *analysis.Pass
	byLine map[string]map[int]ignore
	all    []ignore
}

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
	}
	return ig
}

// report reports msg at pos unless an //idem:ignore with a reason is on
// that line or the line above.
func (ig *ignores) report(pos token.Pos, msg string) {
	p := ig.pass.Fset.Position(pos)
	for _, line := range []int{p.Line, p.Line - 1} {
		if i, ok := ig.byLine[p.Filename][line]; ok && i.reason != "" {
			return
		}
	}
	ig.pass.Report(analysis.Diagnostic{Pos: pos, Message: msg})
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
