package idemvet

import (
	"go/ast"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// Analyzer reports mutating HTTP routes that no idem middleware protects,
// and SQL that reserves keys by locking or checking before inserting. See
// the package documentation for what it recognises and its limits.
var Analyzer = &analysis.Analyzer{
	Name:      "idemvet",
	Doc:       "report POST and PATCH routes without idem's middleware, and SQL that reserves keys by SELECT … FOR UPDATE or check-then-insert",
	URL:       "https://github.com/idem-dev/idem/blob/main/docs/what-needs-protection.md",
	Run:       run,
	FactTypes: []analysis.Fact{(*protects)(nil)},
}

// WhyInsertFirst is where the SQL reports point for the reasoning.
const WhyInsertFirst = "https://github.com/idem-dev/idem/blob/main/docs/why-insert-first.md"

// protects is the fact that a function returns, or a package-level variable
// or field holds, idem's middleware or a handler wrapped in it.
type protects struct{}

func (*protects) AFact() {}

func (*protects) String() string { return "idem middleware" }

func run(pass *analysis.Pass) (any, error) {
	files := checkedFiles(pass)
	st := newState(pass)
	st.solve()
	st.exportFacts()
	ig := newIgnores(pass, files)
	for _, f := range files {
		st.checkRoutes(f, ig)
		checkSQL(pass, f, ig)
	}
	ig.reportMissingReasons()
	return nil, nil
}

// checkedFiles are the files reports are made for: not tests, not
// generated. (Every file still feeds what is known about middleware.)
func checkedFiles(pass *analysis.Pass) []*ast.File {
	var out []*ast.File
	for _, f := range pass.Files {
		name := pass.Fset.File(f.Pos()).Name()
		if strings.HasSuffix(name, "_test.go") || ast.IsGenerated(f) {
			continue
		}
		out = append(out, f)
	}
	return out
}
