package idemproxy

import (
	"errors"
	"net/http"
	"strings"
)

// Method overrides. Many frameworks run a request as the method a header
// names (Symfony, Laravel, ASP.NET Core, Express's method-override,
// Werkzeug's and Rack's MethodOverride middleware, gorilla/handlers), most
// of them only for POST, some for any method. A GET carrying
// "X-HTTP-Method-Override: POST" would then charge, unprotected, on
// every retry. Three headers are in use; CGI-style servers (WSGI, Rack)
// read a header written with '_' as the same one, so those spellings
// count too.
var overrideNames = [...]string{"x-http-method-override", "x-http-method", "x-method-override"}

// isOverrideName reports whether the header name k is a method override:
// one of overrideNames, in any case, '_' standing for '-'.
func isOverrideName(k string) bool {
	switch len(k) {
	case len(overrideNames[0]), len(overrideNames[1]), len(overrideNames[2]):
	default:
		return false
	}
	for _, n := range overrideNames {
		if len(n) != len(k) {
			continue
		}
		i := 0
		for ; i < len(k); i++ {
			c := k[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			} else if c == '_' {
				c = '-'
			}
			if c != n[i] {
				break
			}
		}
		if i == len(k) {
			return true
		}
	}
	return false
}

var (
	errOverrideInvalid  = errors.New("a method-override header names no HTTP method")
	errOverrideConflict = errors.New("the method-override headers name different methods")
)

// overrideOf returns the method that h's override headers name, upper-cased
// as the frameworks that honour them read it: "" when h carries none (or
// only empty ones). The error says why the override cannot be read: a value
// that is not a token (such as "PO ST", or "poſt", which Go's
// strings.ToUpper makes "POST"), or headers that disagree.
func overrideOf(h http.Header) (method string, present bool, err error) {
	for k, vs := range h {
		if !isOverrideName(k) {
			continue
		}
		present = true
		for _, v := range vs {
			v = strings.TrimSpace(v)
			if v == "" {
				continue
			}
			if !validToken(v) {
				return "", true, errOverrideInvalid
			}
			v = strings.ToUpper(v) // ASCII: v is a token
			if method != "" && method != v {
				return "", true, errOverrideConflict
			}
			method = v
		}
	}
	return method, present, nil
}

// stripOverrides removes h's override headers.
func stripOverrides(h http.Header) {
	for k := range h {
		if isOverrideName(k) {
			delete(h, k)
		}
	}
}
