package idem_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
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

// TestReviewLineHostileKey: a key of visible ASCII chosen to look like more
// attributes stays one quoted value on the review line, in text and JSON.
func TestReviewLineHostileKey(t *testing.T) {
	t.Parallel()
	const key = `k"\ key_digest=0 msg="forged"`
	for _, format := range []string{"text", "json"} {
		var logs syncBuffer
		var h slog.Handler = slog.NewTextHandler(&logs, nil)
		if format == "json" {
			h = slog.NewJSONHandler(&logs, nil)
		}
		mem := idemmem.MustNew(idemmem.Config{})
		t.Cleanup(func() { mem.Close() })
		e, err := idem.NewEngine(mem, idem.EngineConfig{Logger: slog.New(h)})
		if err != nil {
			t.Fatal(err)
		}
		k := strings.ReplaceAll(key, " ", "_") // keys are visible ASCII: no space
		res, err := e.Begin(t.Context(), idem.Request{Key: idem.Key{Scope: "s", Operation: "op", Key: k}, Fingerprint: "f"})
		if err != nil {
			t.Fatal(err)
		}
		if err := res.Lease.Escalate(t.Context(), "unknown"); err != nil {
			t.Fatal(err)
		}
		line := strings.TrimSpace(logs.String())
		if strings.Count(line, "\n") != 0 || strings.Count(line, "key_digest=") > 2 {
			t.Fatalf("%s: %s", format, line)
		}
		switch format {
		case "text":
			if !strings.Contains(line, ` key="k\"\\_key_digest=0_msg=\"forged\""`) || strings.Count(line, " msg=") != 1 {
				t.Errorf("text: the key is not one quoted value: %s", line)
			}
		case "json":
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil || m["key"] != k || m["msg"] != "idem: key needs review" {
				t.Errorf("json: %v %v", m, err)
			}
		}
	}
}
