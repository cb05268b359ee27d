package idemproxy

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The settings of the proxy's HTTP edges: how paths are read
// (MergeSlashes, EscapedSlashes, PathParams), what method overrides do
// (MethodOverride), and the bounds on client connections, writes and
// buffered bodies. docs/proxy.md (Paths, Methods) explains each.

// EscapedSlashes is what an encoded slash (%2F) in a request's path does.
type EscapedSlashes string

// The escaped-slash policies.
const (
	// EscapedSlashesKeep keeps %2F encoded: "/a%2Fb" and "/a/b" are two
	// paths, to idem and to the upstream. The default.
	EscapedSlashesKeep EscapedSlashes = "keep"
	// EscapedSlashesDecode decodes %2F to '/' before the path is read, for
	// upstreams that decode it before they route (most WSGI servers do).
	EscapedSlashesDecode EscapedSlashes = "decode"
	// EscapedSlashesReject answers 400 (invalid_path) to a protected
	// request whose path carries %2F.
	EscapedSlashesReject EscapedSlashes = "reject"
)

func (e EscapedSlashes) check() error {
	return oneOf("escaped_slashes", e, EscapedSlashesKeep, EscapedSlashesDecode, EscapedSlashesReject)
}

// UnmarshalYAML checks the policy's name.
func (e *EscapedSlashes) UnmarshalYAML(n *yaml.Node) error { return unmarshalChoice(n, e) }

// PathParams is what a ';' in a request's path does.
type PathParams string

// The path-parameter policies.
const (
	// PathParamsReject answers 400 (invalid_path) to a protected request
	// whose path carries a ';'; other requests pass with it. The default:
	// servlet containers drop what follows a ';' in a segment
	// ("/pay;x=1" is "/pay") and other servers keep it, so idem cannot
	// know which resource such a path names.
	PathParamsReject PathParams = "reject"
	// PathParamsStrip removes each segment's parameters, from its ';' to
	// the next '/', as Java servlet containers do before they route.
	PathParamsStrip PathParams = "strip"
	// PathParamsKeep keeps them: "/pay;x=1" is a path of its own.
	PathParamsKeep PathParams = "keep"
)

func (p PathParams) check() error {
	return oneOf("path_params", p, PathParamsReject, PathParamsStrip, PathParamsKeep)
}

// UnmarshalYAML checks the policy's name.
func (p *PathParams) UnmarshalYAML(n *yaml.Node) error { return unmarshalChoice(n, p) }

// MethodOverride is what a route does with method-override headers.
type MethodOverride string

// The method-override policies.
const (
	// OverrideProtect protects a request whose override names a protected
	// method as that method, and forwards it unchanged. The default.
	OverrideProtect MethodOverride = "protect"
	// OverrideStrip removes the override headers before forwarding.
	OverrideStrip MethodOverride = "strip"
	// OverrideRefuse answers 400 (invalid_method) to a request that
	// carries one.
	OverrideRefuse MethodOverride = "refuse"
)

func (m MethodOverride) check() error {
	return oneOf("method_override", m, OverrideProtect, OverrideStrip, OverrideRefuse)
}

// ParseMethodOverride parses "protect", "strip" or "refuse".
func ParseMethodOverride(s string) (MethodOverride, error) {
	if err := MethodOverride(s).check(); err != nil {
		return "", err
	}
	return MethodOverride(s), nil
}

// UnmarshalYAML checks the policy's name.
func (m *MethodOverride) UnmarshalYAML(n *yaml.Node) error { return unmarshalChoice(n, m) }

// oneOf reports a value of setting that is none of choices.
func oneOf[T ~string](setting string, v T, choices ...T) error {
	if slices.Contains(choices, v) {
		return nil
	}
	names := make([]string, len(choices))
	for i, c := range choices {
		names[i] = string(c)
	}
	return fmt.Errorf("%s must be %s or %s, got %q", setting, strings.Join(names[:len(names)-1], ", "), names[len(names)-1], string(v))
}

// unmarshalChoice sets *v to a YAML scalar that its check accepts.
func unmarshalChoice[T interface {
	~string
	check() error
}](n *yaml.Node, v *T) error {
	c := T(n.Value)
	if err := c.check(); err != nil || n.Kind != yaml.ScalarNode {
		if err == nil {
			err = fmt.Errorf("%q is not a name", n.Value)
		}
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*v = c
	return nil
}

// checkBodyMemory reports a max_body_memory that a route's body could
// never fit in.
func (c Config) checkBodyMemory() error {
	if c.MaxBodyMemory < 0 {
		return fmt.Errorf("max_body_memory %d is negative", c.MaxBodyMemory)
	}
	for _, r := range append([]Route{{Settings: c.Settings}}, c.Routes...) {
		// A body of max_body is read with a byte of room more, to see its
		// end.
		if mb := r.Settings.merge(c.Settings).maxBody(); mb >= c.MaxBodyMemory {
			what := "max_body"
			if r.Match.Pattern != "" {
				what = fmt.Sprintf("line %d: route %q: max_body", r.Match.Line, r.Match.Pattern)
			}
			return fmt.Errorf("%s %d is over max_body_memory %d less the byte that ends a body: such a body could never be read", what, mb, c.MaxBodyMemory)
		}
	}
	return nil
}

// maxBody is the merged settings' request body limit.
func (s Settings) maxBody() int64 {
	if s.MaxBody == nil || *s.MaxBody == 0 {
		return DefaultMaxBody
	}
	return *s.MaxBody
}

// checkRouteMethod reports a route pattern whose method is not upper
// case: methods are case-sensitive, and a route for "post" would protect
// only requests spelt so.
func checkRouteMethod(pattern string) error {
	m := patternMethods(pattern)
	if len(m) == 1 && m[0] != strings.ToUpper(m[0]) {
		return fmt.Errorf("the method %q is not upper case: methods are case-sensitive (write %s)", m[0], strings.ToUpper(m[0]))
	}
	return nil
}
