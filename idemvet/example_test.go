package idemvet_test

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/idem-dev/idem/idemvet"
)

// Run the analyzer in a program of your own, as idem vet does. (From the
// command line: idem vet ./..., or go vet -vettool=$(which idem-vet) ./...)
func Example() {
	cfg := &packages.Config{
		Dir: filepath.Join("testdata", "example"),
		// The example is a module of its own, outside the workspace.
		Env: append(os.Environ(), "GOWORK=off"),
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedImports | packages.NeedDeps |
			packages.NeedTypes | packages.NeedTypesInfo | packages.NeedSyntax | packages.NeedTypesSizes,
	}
	pkgs, err := packages.Load(cfg, ".")
	if err != nil {
		panic(err)
	}
	graph, err := checker.Analyze([]*analysis.Analyzer{idemvet.Analyzer}, pkgs, nil)
	if err != nil {
		panic(err)
	}
	for _, act := range graph.Roots {
		for _, d := range act.Diagnostics {
			p := act.Package.Fset.Position(d.Pos)
			fmt.Printf("%s:%d: %.73s…\n", filepath.Base(p.Filename), p.Line, d.Message)
		}
	}
	// Output:
	// reserve.go:9: SELECT … FOR UPDATE on idempotency_keys before INSERT into it: a row that…
}
