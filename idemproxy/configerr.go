package idemproxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// unknownFieldRE matches yaml's "line 3: field retension not found in type
// idemproxy.Config".
var unknownFieldRE = regexp.MustCompile(`^line (\d+): field (\S+) not found in type (\S+)$`)

// yamlError rewrites a YAML decoding error for a person: unknown fields are
// named with the nearest known one, and Go type names are left out.
func yamlError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = m
		sm := unknownFieldRE.FindStringSubmatch(m)
		if sm == nil {
			continue
		}
		known := configFields
		if strings.HasSuffix(sm[3], ".Route") {
			known = routeFields
		}
		msgs[i] = fmt.Sprintf("line %s: unknown field %q", sm[1], sm[2])
		if s := nearest(sm[2], known); s != "" {
			msgs[i] += fmt.Sprintf(" (did you mean %s?)", s)
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

// configFields and routeFields are the YAML names of Config's and Route's
// fields.
var (
	configFields = yamlFields(reflect.TypeFor[Config]())
	routeFields  = yamlFields(reflect.TypeFor[Route]())
)

func yamlFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case opts == "inline":
			out = append(out, yamlFields(f.Type)...)
		case name != "" && name != "-":
			out = append(out, name)
		}
	}
	return out
}

// nearest returns the known name closest to name, if one is close enough to
// be a likely misspelling.
func nearest(name string, known []string) string {
	best, bestD := "", len(name)/3+2
	lower := strings.ToLower(name)
	for _, k := range known {
		if d := editDistance(lower, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// checkUpstream reports an upstream that is not an http:// or https:// URL
// with a host, suggesting the scheme when it is missing.
func checkUpstream(u string) error {
	p, err := url.Parse(u)
	if err == nil && (p.Scheme == "http" || p.Scheme == "https" || p.Scheme == SchemeH2C) && p.Host != "" {
		return nil
	}
	if !strings.Contains(u, "://") {
		// "127.0.0.1:3000" does not parse; "localhost:3000" parses with
		// "localhost" as its scheme.
		return fmt.Errorf("upstream %q has no scheme: add http:// (--upstream http://%s)", u, u)
	}
	if err != nil {
		return fmt.Errorf("upstream %q: %v", u, err)
	}
	return fmt.Errorf("upstream %q must be an http:// or https:// URL with a host", u)
}

// checkRoutes reports routes whose patterns ServeMux refuses together: two
// that match the same requests, named by their lines.
func checkRoutes(routes []Route) error {
	mux := http.NewServeMux()
	for i, r := range routes {
		if r.Match.Pattern == "" || handle(mux, r.Match.Pattern, http.NotFoundHandler()) == nil {
			continue
		}
		for _, prev := range routes[:i] {
			if prev.Match.Pattern == "" {
				continue
			}
			pair := http.NewServeMux()
			_ = handle(pair, prev.Match.Pattern, http.NotFoundHandler())
			if err := handle(pair, r.Match.Pattern, http.NotFoundHandler()); err != nil {
				why := err.Error()
				if _, after, ok := strings.Cut(why, ":\n"); ok {
					why = after // ServeMux's explanation, without its source paths
				}
				return fmt.Errorf("line %d: route %q conflicts with the route on line %d (%q): %s",
					r.Match.Line, r.Match.Pattern, prev.Match.Line, prev.Match.Pattern, why)
			}
		}
		return fmt.Errorf("line %d: route %q conflicts with another route", r.Match.Line, r.Match.Pattern)
	}
	return nil
}

// handle adds h at pattern to mux, returning ServeMux's panic as an error.
func handle(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}
