// Package protect builds the middleware for the packages that import it.
package protect

import (
	"net/http"

	"github.com/idem-dev/idem"
)

// Engine is shared.
var Engine = &idem.Engine{}

// Idem is the middleware, built once.
var Idem = idem.Middleware(Engine, idem.Config{Scope: idem.GlobalScope})

// New builds the middleware.
func New(e *idem.Engine) func(http.Handler) http.Handler {
	return idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})
}

// Handler wraps h.
func Handler(h http.Handler) http.Handler {
	return Idem(h)
}

// Logger is not idem's.
func Logger(next http.Handler) http.Handler { return next }
