package idemproxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemproxy"
)

// TestEdgeSettings: the settings of the proxy's HTTP edges parse, take
// their defaults, and name the line of a bad value.
func TestEdgeSettings(t *testing.T) {
	t.Parallel()
	c, err := idemproxy.ParseConfig([]byte(`upstream: http://127.0.0.1:3000
client_write_timeout: 5s
max_body_memory: 8388608
max_connections: 500
merge_slashes: false
escaped_slashes: decode
path_params: strip
method_override: strip
routes:
  - match: POST /pay
    method_override: refuse
`))
	if err != nil {
		t.Fatal(err)
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.ClientWriteTimeout.String() != "5s" || c.MaxBodyMemory != 8<<20 || c.MaxConnections != 500 || *c.MergeSlashes ||
		c.EscapedSlashes != idemproxy.EscapedSlashesDecode || c.PathParams != idemproxy.PathParamsStrip ||
		c.MethodOverride != idemproxy.OverrideStrip || c.Routes[0].MethodOverride != idemproxy.OverrideRefuse {
		t.Fatalf("parsed %+v", c)
	}
	d := idemproxy.Config{}.WithDefaults()
	if time.Duration(d.ClientWriteTimeout) != idemproxy.DefaultClientWriteTimeout || d.MaxBodyMemory != idemproxy.DefaultMaxBodyMemory ||
		d.MaxConnections != 0 || !*d.MergeSlashes || d.EscapedSlashes != idemproxy.EscapedSlashesKeep ||
		d.PathParams != idemproxy.PathParamsReject || d.MethodOverride != idemproxy.OverrideProtect {
		t.Fatalf("defaults %+v", d)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"escaped_slashes: maybe\n", "line 1: escaped_slashes must be"},
		{"path_params: drop\n", "line 1: path_params must be"},
		{"routes:\n  - match: POST /x\n    method_override: allow\n", "line 3: method_override must be"},
		{"method_override: [protect]\n", "method_override must be"},
	} {
		if _, err := idemproxy.ParseConfig([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want %q", tc.yaml, err, tc.want)
		}
	}
}
