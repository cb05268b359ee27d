package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// keyLines are the only functions of the module whose log lines may carry
// a key in clear (attribute "key"): the lines about a key in review, which
// an operator must find (see idem.KeyDigest). Every other line names a key
// by key_digest.
var keyLines = map[string]bool{
	"logkey.go reviewAttrs":         true, // "idem: key needs review", once per key
	"idemproxy/resolver.go Resolve": true, // the resolver's answer about a key in review
	"idemproxy/webhook.go keyAttrs": true, // a review webhook that failed or was dropped
	"idemadmin/keys.go Resolve":     true, // an operator's action, as the admin API records it
	"idemadmin/keys.go Delete":      true,
}

// TestKeysInLogsFollowTheRule reads every slog attribute named "key" (or
// "id", which encodes the key) in the module's code, and fails for one
// outside keyLines: a new log line that writes a key in clear must be a
// review line, or name the key by its digest.
func TestKeysInLogsFollowTheRule(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	found := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == "examples" || path == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "slog" || (sel.Sel.Name != "String" && sel.Sel.Name != "Any") {
					return true
				}
				lit, ok := call.Args[0].(*ast.BasicLit)
				if !ok {
					return true
				}
				name, _ := strconv.Unquote(lit.Value)
				if name != "key" {
					return true
				}
				where := filepath.ToSlash(path) + " " + fn.Name.Name
				found[where] = true
				if !keyLines[where] {
					t.Errorf("%s: %s writes a key in clear on a log line that is not a review line; name it by its digest (key_digest, idem.KeyDigest)", fset.Position(call.Pos()), where)
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for where := range keyLines {
		if !found[where] {
			t.Errorf("%s is allowed to log keys but no longer does: drop it from keyLines", where)
		}
	}
}
