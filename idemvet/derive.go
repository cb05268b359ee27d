package idemvet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

const idemPath = "github.com/idem-dev/idem"

// state is what one package teaches about idem's middleware and routers.
type state struct {
	pass *analysis.Pass
	// derived: variables, fields and functions of this package that hold or
	// return idem's middleware, or a handler wrapped in it.
	derived map[types.Object]bool
	// wrapped: routers and muxes passed through the middleware, or that
	// Use it.
	wrapped map[types.Object]bool
	// parents: the expressions a router variable was made from or mounted
	// under, whose protection it inherits.
	parents map[types.Object][]ast.Expr
	// prefix: the path a router variable is mounted at (chi Route, Mount).
	prefix map[types.Object]string
	// decls: the declarations of this package's functions.
	decls map[*types.Func]*ast.FuncDecl
}

func newState(pass *analysis.Pass) *state {
	st := &state{
		pass:    pass,
		derived: map[types.Object]bool{},
		wrapped: map[types.Object]bool{},
		parents: map[types.Object][]ast.Expr{},
		prefix:  map[types.Object]string{},
		decls:   map[*types.Func]*ast.FuncDecl{},
	}
	for _, f := range pass.Files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				if fn, ok := pass.TypesInfo.Defs[fd.Name].(*types.Func); ok {
					st.decls[fn] = fd
				}
			}
		}
	}
	return st
}

// solve learns, until nothing changes, which objects carry the middleware
// and which routers it wraps.
func (st *state) solve() {
	for range 20 { // each round follows one more step; real code needs few
		changed := false
		mark := func(m map[types.Object]bool, obj types.Object) {
			if obj != nil && !m[obj] {
				m[obj] = true
				changed = true
			}
		}
		for _, f := range st.pass.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.AssignStmt:
					st.assign(n.Lhs, n.Rhs, func(obj types.Object) { mark(st.derived, obj) })
				case *ast.ValueSpec:
					lhs := make([]ast.Expr, len(n.Names))
					for i, id := range n.Names {
						lhs[i] = id
					}
					st.assign(lhs, n.Values, func(obj types.Object) { mark(st.derived, obj) })
				case *ast.KeyValueExpr:
					// A struct literal's field: &Server{mw: idem.Middleware(…)}.
					if id, ok := n.Key.(*ast.Ident); ok && st.derivedExpr(n.Value) {
						if v, ok := st.pass.TypesInfo.Uses[id].(*types.Var); ok && v.IsField() {
							mark(st.derived, v)
						}
					}
				case *ast.FuncDecl:
					if n.Body != nil && st.returnsDerived(n.Body) {
						mark(st.derived, st.pass.TypesInfo.Defs[n.Name])
					}
				case *ast.CallExpr:
					st.call(n, func(obj types.Object) { mark(st.derived, obj) }, func(obj types.Object) { mark(st.wrapped, obj) })
				}
				return true
			})
		}
		if !changed {
			return
		}
	}
}

// assign marks the variables that an assignment gives the middleware, and
// records where router variables come from.
func (st *state) assign(lhs, rhs []ast.Expr, mark func(types.Object)) {
	for i, l := range lhs {
		var r ast.Expr
		switch {
		case len(rhs) == len(lhs):
			r = rhs[i]
		case len(rhs) == 1 && i == 0:
			r = rhs[0] // mw, err := idem.NewMiddleware(…)
		default:
			continue
		}
		obj := st.objectOf(l)
		if obj == nil {
			continue
		}
		if st.derivedExpr(r) {
			mark(obj)
		}
		if isRouter(st.pass.TypesInfo.TypeOf(l)) {
			st.addParent(obj, r)
		}
	}
}

func (st *state) addParent(obj types.Object, e ast.Expr) {
	for _, p := range st.parents[obj] {
		if p == e {
			return
		}
	}
	st.parents[obj] = append(st.parents[obj], e)
}

// call learns from one call: a middleware applied to a router wraps it;
// chi's Use wraps its router; Group, Route and Mount make children; a
// function of this package called with the middleware or a router passes
// it to its parameter.
func (st *state) call(call *ast.CallExpr, markDerived, markWrapped func(types.Object)) {
	info := st.pass.TypesInfo
	// mw(mux), chi.Chain(mw).Handler(mux), protect(mux): what passes through
	// the middleware is wrapped.
	if st.derivedExpr(call.Fun) || st.calleeDerived(call) {
		for _, a := range call.Args {
			if obj := st.objectOf(a); obj != nil {
				markWrapped(obj)
			}
		}
	}
	fn, _ := typeutil.Callee(info, call).(*types.Func)
	if fn == nil {
		return
	}
	if recv := st.recvExpr(call); recv != nil && isChi(fn) {
		switch fn.Name() {
		case "Use":
			for _, a := range call.Args {
				if st.derivedExpr(a) {
					if obj := st.objectOf(recv); obj != nil {
						markWrapped(obj)
					}
				}
			}
		case "Group", "Route":
			if len(call.Args) == 0 {
				return
			}
			lit, ok := call.Args[len(call.Args)-1].(*ast.FuncLit)
			if !ok || len(lit.Type.Params.List) == 0 || len(lit.Type.Params.List[0].Names) == 0 {
				return
			}
			param := info.Defs[lit.Type.Params.List[0].Names[0]]
			if param == nil {
				return
			}
			st.addParent(param, recv)
			if fn.Name() == "Route" {
				if p, ok := constString(info, call.Args[0]); ok {
					st.prefix[param] = joinPath(st.prefixOf(recv), p)
				}
			}
		case "Mount":
			if len(call.Args) == 2 {
				if obj := st.objectOf(call.Args[1]); obj != nil {
					st.addParent(obj, recv)
					if p, ok := constString(info, call.Args[0]); ok {
						st.prefix[obj] = joinPath(st.prefixOf(recv), p)
					}
				}
			}
		}
	}
	// A router served by another router's route inherits its protection:
	// mux.Handle("/api/", http.StripPrefix("/api", api)).
	if recv := st.recvExpr(call); recv != nil && (isChi(fn) || isServeMux(fn)) && (fn.Name() == "Handle" || fn.Name() == "HandleFunc") && len(call.Args) == 2 {
		ast.Inspect(call.Args[1], func(n ast.Node) bool {
			if e, ok := n.(ast.Expr); ok && isRouter(info.TypeOf(e)) {
				if obj := st.objectOf(e); obj != nil {
					st.addParent(obj, recv)
				}
			}
			return true
		})
	}
	// A function of this package: its parameters get what it is called with.
	if fd := st.decls[fn.Origin()]; fd != nil {
		sig := fn.Origin().Signature() // the declaration's own parameters
		for i, a := range call.Args {
			if i >= sig.Params().Len() || (sig.Variadic() && i >= sig.Params().Len()-1) {
				break
			}
			p := sig.Params().At(i)
			if st.derivedExpr(a) {
				markDerived(p)
			}
			if isRouter(p.Type()) {
				st.addParent(p, a)
			}
		}
	}
}

// derivedExpr reports whether e is idem's middleware, a handler wrapped in
// it, or something made from either.
func (st *state) derivedExpr(e ast.Expr) bool {
	info := st.pass.TypesInfo
	switch e := ast.Unparen(e).(type) {
	case *ast.Ident:
		return st.objDerived(info.ObjectOf(e))
	case *ast.SelectorExpr:
		if sel, ok := info.Selections[e]; ok && sel.Kind() == types.MethodVal {
			// mw(h).ServeHTTP, or s.protect as a method value.
			return st.derivedExpr(e.X) || st.objDerived(sel.Obj())
		}
		return st.objDerived(info.ObjectOf(e.Sel))
	case *ast.CallExpr:
		if tv, ok := info.Types[e.Fun]; ok && tv.IsType() {
			return len(e.Args) == 1 && st.derivedExpr(e.Args[0]) // http.HandlerFunc(x)
		}
		if st.calleeDerived(e) || st.derivedExpr(e.Fun) {
			return true
		}
		if recv := st.recvExpr(e); recv != nil && st.derivedExpr(recv) {
			return true // chi.Chain(mw).Handler(h)
		}
		if handlerish(info.TypeOf(e)) {
			for _, a := range e.Args {
				if st.derivedExpr(a) {
					return true // otelhttp.NewHandler(mw(h), "x")
				}
			}
		}
	case *ast.FuncLit:
		return st.returnsDerived(e.Body) // func(next) http.Handler { return mw(next) }
	case *ast.CompositeLit:
		// chi.Middlewares{mw}, []func(http.Handler) http.Handler{mw}; a
		// struct holding the middleware is not itself one.
		if t := info.TypeOf(e); t == nil {
			return false
		} else if _, ok := t.Underlying().(*types.Struct); ok {
			return false
		}
		for _, el := range e.Elts {
			if kv, ok := el.(*ast.KeyValueExpr); ok {
				el = kv.Value
			}
			if st.derivedExpr(el) {
				return true
			}
		}
	case *ast.UnaryExpr:
		return st.derivedExpr(e.X)
	case *ast.StarExpr:
		return st.derivedExpr(e.X)
	case *ast.IndexExpr:
		return st.derivedExpr(e.X)
	}
	return false
}

// calleeDerived reports whether call calls idem.Middleware or
// idem.NewMiddleware, or a function known to return what they make.
func (st *state) calleeDerived(call *ast.CallExpr) bool {
	fn, _ := typeutil.Callee(st.pass.TypesInfo, call).(*types.Func)
	if fn == nil {
		return false
	}
	if fn.Pkg() != nil && fn.Pkg().Path() == idemPath && fn.Signature().Recv() == nil && (fn.Name() == "Middleware" || fn.Name() == "NewMiddleware") {
		return true
	}
	return st.objDerived(fn.Origin())
}

func (st *state) objDerived(obj types.Object) bool {
	if obj == nil {
		return false
	}
	if st.derived[obj] {
		return true
	}
	if obj.Pkg() != nil && obj.Pkg() != st.pass.Pkg {
		return st.pass.ImportObjectFact(obj, new(protects))
	}
	return false
}

// returnsDerived reports whether a function body returns the middleware or
// a handler wrapped in it (nested function literals aside).
func (st *state) returnsDerived(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ReturnStmt:
			for _, r := range n.Results {
				if st.derivedExpr(r) {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

// exportFacts shares what this package learned with the packages that
// import it: functions, package-level variables and fields.
func (st *state) exportFacts() {
	for obj := range st.derived {
		if obj.Pkg() != st.pass.Pkg {
			continue
		}
		switch o := obj.(type) {
		case *types.Func:
			st.pass.ExportObjectFact(o, &protects{})
		case *types.Var:
			if o.IsField() || o.Parent() == st.pass.Pkg.Scope() {
				st.pass.ExportObjectFact(o, &protects{})
			}
		}
	}
}

// objectOf returns the variable, field or function an identifier or
// selector names, or nil.
func (st *state) objectOf(e ast.Expr) types.Object {
	switch e := ast.Unparen(e).(type) {
	case *ast.Ident:
		if obj := st.pass.TypesInfo.ObjectOf(e); obj != nil && e.Name != "_" {
			if _, ok := obj.(*types.Var); ok {
				return obj
			}
		}
	case *ast.SelectorExpr:
		if obj, ok := st.pass.TypesInfo.ObjectOf(e.Sel).(*types.Var); ok {
			return obj
		}
	case *ast.UnaryExpr:
		return st.objectOf(e.X)
	case *ast.StarExpr:
		return st.objectOf(e.X)
	}
	return nil
}

// recvExpr returns the receiver of a method call x.m(…), or nil.
func (st *state) recvExpr(call *ast.CallExpr) ast.Expr {
	if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
		if s, ok := st.pass.TypesInfo.Selections[sel]; ok && s.Kind() == types.MethodVal {
			return sel.X
		}
	}
	return nil
}
