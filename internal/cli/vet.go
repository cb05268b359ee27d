package cli

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/idem-dev/idem/idemvet"
)

func init() { extraCommands = append(extraCommands, newVetCmd) }

func newVetCmd() *cobra.Command {
	var (
		asJSON bool
		dir    string
	)
	cmd := &cobra.Command{
		Use:   "vet [packages]",
		Short: "Find Go routes and SQL that need idempotency protection",
		Long: `vet loads Go packages (default ./...) and reports:

  - POST and PATCH routes, on net/http's ServeMux or chi, whose handler no
    idem middleware wraps, on the route or on a router above it:
      POST /payments: mutating route without idempotency protection
  - SQL that locks a row with SELECT … FOR UPDATE before inserting into the
    same table, and check-then-insert on a table whose name contains
    "idempot": reserve by INSERT against a unique constraint instead.

A comment //idem:ignore <reason> on the line, or the line above, suppresses
its reports; without a reason it is itself reported. Test files are not
checked.

The same analyzer runs under go vet, with its results cached between runs:

  go install github.com/idem-dev/idem/cmd/idem-vet@latest
  go vet -vettool=$(which idem-vet) ./...

Exit status: 0 nothing found, 1 findings, 2 when the packages do not load.`,
		Example: `  idem vet ./...
  idem vet --json ./internal/api/...`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = []string{"./..."}
			}
			return runVet(cmd, dir, args, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of {file, line, column, message}")
	cmd.Flags().StringVarP(&dir, "dir", "C", "", "run in this directory (default: the current one)")
	return cmd
}

// vetFinding is one report, as --json prints it.
type vetFinding struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Column  int    `json:"column"`
	Message string `json:"message"`
}

func runVet(cmd *cobra.Command, dir string, patterns []string, asJSON bool) error {
	cfg := &packages.Config{
		Context: cmd.Context(),
		Dir:     dir,
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedCompiledGoFiles | packages.NeedImports |
			packages.NeedTypes | packages.NeedTypesSizes | packages.NeedSyntax | packages.NeedTypesInfo |
			packages.NeedDeps | packages.NeedModule,
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return usageError{fmt.Errorf("loading packages: %w", err)}
	}
	if len(pkgs) == 0 {
		return usageError{fmt.Errorf("no packages match %s", strings.Join(patterns, " "))}
	}
	var loadErrs []string
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			loadErrs = append(loadErrs, e.Error())
		}
	})
	if len(loadErrs) > 0 {
		for _, e := range loadErrs {
			fmt.Fprintln(cmd.ErrOrStderr(), e)
		}
		return usageError{fmt.Errorf("%d error(s) loading the packages; fix them (go build) and vet again", len(loadErrs))}
	}
	graph, err := checker.Analyze([]*analysis.Analyzer{idemvet.Analyzer}, pkgs, nil)
	if err != nil {
		return err
	}
	base := dir
	if base == "" {
		base, _ = os.Getwd()
	}
	findings := []vetFinding{}
	for _, act := range graph.Roots {
		if act.Err != nil {
			return fmt.Errorf("%s: %w", act.Package.PkgPath, act.Err)
		}
		fset := act.Package.Fset
		for _, d := range act.Diagnostics {
			p := fset.Position(d.Pos)
			file := p.Filename
			if rel, err := filepath.Rel(base, file); err == nil && !strings.HasPrefix(rel, "..") {
				file = rel
			}
			findings = append(findings, vetFinding{File: file, Line: p.Line, Column: p.Column, Message: d.Message})
		}
	}
	slices.SortFunc(findings, func(a, b vetFinding) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column), cmp.Compare(a.Message, b.Message))
	})
	out := cmd.OutOrStdout()
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(findings); err != nil {
			return err
		}
	} else {
		for _, f := range findings {
			fmt.Fprintf(out, "%s:%d:%d: %s\n", f.File, f.Line, f.Column, f.Message)
		}
	}
	if len(findings) > 0 {
		if len(findings) == 1 {
			return errors.New("1 finding (see docs/what-needs-protection.md)")
		}
		return fmt.Errorf("%d findings (see docs/what-needs-protection.md)", len(findings))
	}
	return nil
}
