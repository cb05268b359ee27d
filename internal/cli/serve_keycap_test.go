package cli

import (
	"io"
	"strings"
	"testing"
)

// TestServeNewKeysPerScopeFlag: --new-keys-per-scope is off by default,
// and a bad value stops idem serve before it starts.
func TestServeNewKeysPerScopeFlag(t *testing.T) {
	t.Parallel()
	if f := newServeCmd().Flags().Lookup("new-keys-per-scope"); f == nil || f.DefValue != "off" {
		t.Fatalf("--new-keys-per-scope: %+v; want default off", f)
	}
	for _, tc := range []struct{ args, want string }{
		{"--new-keys-per-scope 100/1ms", "at least a second"},
		{"--new-keys-per-scope lots", "LIMIT/INTERVAL"},
	} {
		cmd := newServeCmd()
		cmd.SetArgs(append([]string{"--upstream", "http://127.0.0.1:1"}, strings.Fields(tc.args)...))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.args, err, tc.want)
		}
	}
}
