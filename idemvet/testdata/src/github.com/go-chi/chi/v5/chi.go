// Package chi is a stub of github.com/go-chi/chi/v5 with the signatures
// the analyzer looks at.
package chi

import "net/http"

// Middlewares is a stack of middleware.
type Middlewares []func(http.Handler) http.Handler

// Chain returns a stack of middleware.
func Chain(middlewares ...func(http.Handler) http.Handler) Middlewares { return middlewares }

// Handler wraps h in the stack.
func (mws Middlewares) Handler(h http.Handler) http.Handler { return h }

// Routes is what a router can tell about itself.
type Routes interface {
	Match(rctx any, method, path string) bool
}

// Router is chi's router interface.
type Router interface {
	http.Handler
	Routes
	Use(middlewares ...func(http.Handler) http.Handler)
	With(middlewares ...func(http.Handler) http.Handler) Router
	Group(fn func(r Router)) Router
	Route(pattern string, fn func(r Router)) Router
	Mount(pattern string, h http.Handler)
	Handle(pattern string, h http.Handler)
	HandleFunc(pattern string, h http.HandlerFunc)
	Method(method, pattern string, h http.Handler)
	MethodFunc(method, pattern string, h http.HandlerFunc)
	Connect(pattern string, h http.HandlerFunc)
	Delete(pattern string, h http.HandlerFunc)
	Get(pattern string, h http.HandlerFunc)
	Head(pattern string, h http.HandlerFunc)
	Options(pattern string, h http.HandlerFunc)
	Patch(pattern string, h http.HandlerFunc)
	Post(pattern string, h http.HandlerFunc)
	Put(pattern string, h http.HandlerFunc)
	Trace(pattern string, h http.HandlerFunc)
}

// Mux is chi's router.
type Mux struct{}

var _ Router = (*Mux)(nil)

// NewRouter returns a router.
func NewRouter() *Mux { return &Mux{} }

func (mx *Mux) ServeHTTP(http.ResponseWriter, *http.Request)          {}
func (mx *Mux) Match(any, string, string) bool                        { return false }
func (mx *Mux) Use(...func(http.Handler) http.Handler)                {}
func (mx *Mux) With(...func(http.Handler) http.Handler) Router        { return mx }
func (mx *Mux) Group(fn func(r Router)) Router                        { return mx }
func (mx *Mux) Route(pattern string, fn func(r Router)) Router        { return mx }
func (mx *Mux) Mount(pattern string, h http.Handler)                  {}
func (mx *Mux) Handle(pattern string, h http.Handler)                 {}
func (mx *Mux) HandleFunc(pattern string, h http.HandlerFunc)         {}
func (mx *Mux) Method(method, pattern string, h http.Handler)         {}
func (mx *Mux) MethodFunc(method, pattern string, h http.HandlerFunc) {}
func (mx *Mux) Connect(pattern string, h http.HandlerFunc)            {}
func (mx *Mux) Delete(pattern string, h http.HandlerFunc)             {}
func (mx *Mux) Get(pattern string, h http.HandlerFunc)                {}
func (mx *Mux) Head(pattern string, h http.HandlerFunc)               {}
func (mx *Mux) Options(pattern string, h http.HandlerFunc)            {}
func (mx *Mux) Patch(pattern string, h http.HandlerFunc)              {}
func (mx *Mux) Post(pattern string, h http.HandlerFunc)               {}
func (mx *Mux) Put(pattern string, h http.HandlerFunc)                {}
func (mx *Mux) Trace(pattern string, h http.HandlerFunc)              {}
