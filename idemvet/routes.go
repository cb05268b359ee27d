package idemvet

import (
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"net/http"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/tools/go/types/typeutil"
)

// mutating are the methods reported: those idem's middleware protects by
// default.
var mutating = map[string]bool{http.MethodPost: true, http.MethodPatch: true}

// checkRoutes reports every unprotected mutating route registered in f.
func (st *state) checkRoutes(f *ast.File, ig *ignores) {
	info := st.pass.TypesInfo
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		fn, _ := typeutil.Callee(info, call).(*types.Func)
		if fn == nil {
			return true
		}
		var (
			router          ast.Expr // nil: http.DefaultServeMux
			method, pattern string
			handler         ast.Expr
			known           bool // the pattern is a constant
		)
		switch {
		case isServeMux(fn) || isHTTPFunc(fn):
			if (fn.Name() != "Handle" && fn.Name() != "HandleFunc") || len(call.Args) != 2 {
				return true
			}
			router = st.recvExpr(call)
			pattern, known = constString(info, call.Args[0])
			method, pattern = splitPattern(pattern)
			handler = call.Args[1]
		case isChi(fn) && st.recvExpr(call) != nil:
			router = st.recvExpr(call)
			switch fn.Name() {
			case "Post", "Patch":
				if len(call.Args) != 2 {
					return true
				}
				method = strings.ToUpper(fn.Name())
				pattern, known = constString(info, call.Args[0])
				handler = call.Args[1]
			case "Method", "MethodFunc":
				if len(call.Args) != 3 {
					return true
				}
				m, ok := constString(info, call.Args[0])
				if !ok {
					return true
				}
				method = strings.ToUpper(m)
				pattern, known = constString(info, call.Args[1])
				handler = call.Args[2]
			case "Handle", "HandleFunc":
				if len(call.Args) != 2 {
					return true
				}
				pattern, known = constString(info, call.Args[0])
				method, pattern = splitPattern(pattern)
				handler = call.Args[1]
			default:
				return true
			}
		default:
			return true
		}
		if !known {
			return true
		}
		var methods []string
		if method != "" {
			if mutating[method] {
				methods = []string{method}
			}
		} else {
			methods = st.methodChecks(handler)
		}
		if len(methods) == 0 {
			return true
		}
		if st.derivedExpr(handler) || st.routerProtected(router, map[types.Object]bool{}) {
			return true
		}
		path := printable(joinPath(st.prefixOf(router), pattern))
		for _, m := range methods {
			ig.report(call.Pos(), m+" "+path+": mutating route without idempotency protection")
		}
		return true
	})
}

// routerProtected reports whether the router expression e (nil for
// http.DefaultServeMux) is wrapped by idem's middleware, or made from a
// router that is.
func (st *state) routerProtected(e ast.Expr, seen map[types.Object]bool) bool {
	if e == nil {
		obj := defaultServeMux(st.pass.Pkg)
		return obj != nil && st.wrapped[obj]
	}
	info := st.pass.TypesInfo
	e = ast.Unparen(e)
	if call, ok := e.(*ast.CallExpr); ok {
		fn, _ := typeutil.Callee(info, call).(*types.Func)
		recv := st.recvExpr(call)
		if fn == nil || recv == nil || !isChi(fn) {
			return false
		}
		switch fn.Name() {
		case "With":
			for _, a := range call.Args {
				if st.derivedExpr(a) {
					return true
				}
			}
			return st.routerProtected(recv, seen)
		case "Group", "Route":
			return st.routerProtected(recv, seen)
		}
		return false
	}
	obj := st.objectOf(e)
	if obj == nil || seen[obj] {
		return false
	}
	seen[obj] = true
	if st.wrapped[obj] {
		return true
	}
	for _, p := range st.parents[obj] {
		if st.routerProtected(p, seen) {
			return true
		}
	}
	return false
}

// prefixOf returns the path a router is mounted at, as far as it is known.
func (st *state) prefixOf(e ast.Expr) string {
	if e == nil {
		return ""
	}
	e = ast.Unparen(e)
	if call, ok := e.(*ast.CallExpr); ok {
		if recv := st.recvExpr(call); recv != nil {
			return st.prefixOf(recv) // r.With(mw), r.Group(nil)
		}
		return ""
	}
	if obj := st.objectOf(e); obj != nil {
		return st.prefix[obj]
	}
	return ""
}

// methodChecks returns the mutating methods a handler compares r.Method
// with, in the order it does: r.Method == http.MethodPost,
// r.Method != "PATCH", switch r.Method { case http.MethodPost: }.
func (st *state) methodChecks(handler ast.Expr) []string {
	body := st.handlerBody(handler)
	if body == nil {
		return nil
	}
	info := st.pass.TypesInfo
	var methods []string
	add := func(e ast.Expr) {
		if m, ok := constString(info, e); ok && mutating[m] {
			for _, have := range methods {
				if have == m {
					return
				}
			}
			methods = append(methods, m)
		}
	}
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			if n.Op != token.EQL && n.Op != token.NEQ {
				return true
			}
			if st.isRequestMethod(n.X) {
				add(n.Y)
			} else if st.isRequestMethod(n.Y) {
				add(n.X)
			}
		case *ast.SwitchStmt:
			if n.Tag != nil && st.isRequestMethod(n.Tag) {
				for _, s := range n.Body.List {
					for _, e := range s.(*ast.CaseClause).List {
						add(e)
					}
				}
			}
		}
		return true
	})
	return methods
}

// handlerBody finds the body of the function a handler expression runs,
// when it is in this package: a function literal, a function or method
// name, http.HandlerFunc(f), or a value whose type has a ServeHTTP method.
func (st *state) handlerBody(e ast.Expr) *ast.BlockStmt {
	info := st.pass.TypesInfo
	e = ast.Unparen(e)
	switch x := e.(type) {
	case *ast.FuncLit:
		return x.Body
	case *ast.CallExpr:
		if tv, ok := info.Types[x.Fun]; ok && tv.IsType() && len(x.Args) == 1 {
			return st.handlerBody(x.Args[0])
		}
	case *ast.Ident, *ast.SelectorExpr:
		var id *ast.Ident
		if sel, ok := x.(*ast.SelectorExpr); ok {
			id = sel.Sel
		} else {
			id = x.(*ast.Ident)
		}
		if fn, ok := info.ObjectOf(id).(*types.Func); ok {
			if fd := st.decls[fn.Origin()]; fd != nil {
				return fd.Body
			}
			return nil
		}
	}
	// A value of a type with ServeHTTP: &paymentsHandler{}, h.
	if t := info.TypeOf(e); t != nil {
		obj, _, _ := types.LookupFieldOrMethod(t, true, st.pass.Pkg, "ServeHTTP")
		if fn, ok := obj.(*types.Func); ok {
			if fd := st.decls[fn.Origin()]; fd != nil {
				return fd.Body
			}
		}
	}
	return nil
}

// isRequestMethod reports whether e is x.Method for an *http.Request x.
func (st *state) isRequestMethod(e ast.Expr) bool {
	sel, ok := ast.Unparen(e).(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Method" {
		return false
	}
	t := st.pass.TypesInfo.TypeOf(sel.X)
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	return isNamed(t, "net/http", "Request")
}

// splitPattern splits a ServeMux pattern "[METHOD ][HOST]/PATH" into its
// method ("" when there is none) and the rest.
func splitPattern(p string) (method, rest string) {
	p = strings.TrimSpace(p)
	if i := strings.IndexAny(p, " \t"); i > 0 {
		m := p[:i]
		if !strings.Contains(m, "/") {
			return m, strings.TrimSpace(p[i+1:])
		}
	}
	return "", p
}

// printable quotes a pattern that holds control or invisible characters,
// so that a report cannot forge lines of its own.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// joinPath joins a mount prefix and a route pattern.
func joinPath(prefix, p string) string {
	prefix = strings.TrimSuffix(strings.TrimSuffix(prefix, "/*"), "/")
	if prefix == "" {
		return p
	}
	if p == "" || p == "/" {
		return prefix + p
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return prefix + p
}

func constString(info *types.Info, e ast.Expr) (string, bool) {
	tv, ok := info.Types[e]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
		return "", false
	}
	return constant.StringVal(tv.Value), true
}

// chiPaths are the import paths of chi's major versions.
func isChiPath(p string) bool {
	return p == "github.com/go-chi/chi" || strings.HasPrefix(p, "github.com/go-chi/chi/v")
}

// isChi reports whether fn is a method of one of chi's routers.
func isChi(fn *types.Func) bool {
	return fn.Pkg() != nil && isChiPath(fn.Pkg().Path()) && fn.Signature().Recv() != nil
}

// isServeMux reports whether fn is a method of *http.ServeMux.
func isServeMux(fn *types.Func) bool {
	recv := fn.Signature().Recv()
	if recv == nil {
		return false
	}
	t := recv.Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	return isNamed(t, "net/http", "ServeMux")
}

// isHTTPFunc reports whether fn is a function of package net/http.
func isHTTPFunc(fn *types.Func) bool {
	return fn.Pkg() != nil && fn.Pkg().Path() == "net/http" && fn.Signature().Recv() == nil
}

// isRouter reports whether t is a router: *http.ServeMux, or one of chi's
// router types.
func isRouter(t types.Type) bool {
	if t == nil {
		return false
	}
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := types.Unalias(t).(*types.Named)
	if !ok || n.Obj().Pkg() == nil {
		return false
	}
	path, name := n.Obj().Pkg().Path(), n.Obj().Name()
	return (path == "net/http" && name == "ServeMux") || (isChiPath(path) && (name == "Mux" || name == "Router" || name == "Routes"))
}

// handlerish reports whether a call's result can carry a handler or a
// middleware along: not a basic value, an error or a tuple.
func handlerish(t types.Type) bool {
	if t == nil {
		return false
	}
	switch t.Underlying().(type) {
	case *types.Basic, *types.Tuple:
		return false
	case *types.Interface:
		return !types.Identical(t, types.Universe.Lookup("error").Type())
	default:
		return true
	}
}

func isNamed(t types.Type, pkg, name string) bool {
	n, ok := types.Unalias(t).(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == pkg && n.Obj().Name() == name
}

// defaultServeMux returns net/http's DefaultServeMux as this package sees
// it, or nil when net/http is not imported.
func defaultServeMux(pkg *types.Package) types.Object {
	for _, imp := range pkg.Imports() {
		if imp.Path() == "net/http" {
			return imp.Scope().Lookup("DefaultServeMux")
		}
	}
	return nil
}
