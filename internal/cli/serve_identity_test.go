package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeIdentityFlags: --scope-header Host, which Go's server keeps out
// of the header map (the scope would read nothing), is refused at start,
// from a flag and from the config file alike, as are malformed
// --host-alias and --upstream-name values.
func TestServeIdentityFlags(t *testing.T) {
	t.Parallel()
	yml := filepath.Join(t.TempDir(), "idem.yaml")
	if err := os.WriteFile(yml, []byte("upstream: http://127.0.0.1:1\nscope_header: host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ args, want string }{
		{"--upstream http://127.0.0.1:1 --scope-header Host", "scope_header (--scope-header) Host"},
		{"--upstream http://127.0.0.1:1 --scope-header X-Forwarded-Host", "scope_header (--scope-header) X-Forwarded-Host"},
		{"--config " + yml, "scope_header (--scope-header) Host"},
		{"--upstream http://127.0.0.1:1 --host-alias * --host-alias a.example", "host_aliases"},
		{"--upstream http://127.0.0.1:1 --upstream-name a\x01b", "upstream_name"},
	} {
		cmd := newServeCmd()
		cmd.SetArgs(strings.Fields(tc.args))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.args, err, tc.want)
		}
	}
}
