package cli

import (
	"io"
	"strings"
	"testing"
)

// TestServeEdgeFlags: the flags of the proxy's HTTP edges are there with
// their defaults, and a bad value stops idem serve before it starts.
func TestServeEdgeFlags(t *testing.T) {
	t.Parallel()
	defaults := map[string]string{
		"client-write-timeout": "30s", "max-body-memory": "67108864", "max-connections": "0",
		"max-replay-memory": "67108864", "max-decoded-replay": "16777216",
		"merge-slashes": "true", "escaped-slashes": "keep", "path-params": "reject", "method-override": "protect",
	}
	fl := newServeCmd().Flags()
	for name, want := range defaults {
		f := fl.Lookup(name)
		if f == nil || f.DefValue != want {
			t.Errorf("--%s: %+v; want default %s", name, f, want)
		}
	}
	for _, tc := range []struct{ args, want string }{
		{"--method-override allow", "method_override must be protect, strip or refuse"},
		{"--path-params drop", "path_params must be reject, strip or keep"},
		{"--escaped-slashes yes", "escaped_slashes must be keep, decode or reject"},
		{"--max-body-memory 10", "over max_body_memory"},
		{"--client-write-timeout -1s", "client_write_timeout"},
		{"--max-replay-memory 1024", "max_replay_memory 1024 is under"},
		{"--max-decoded-replay -1", "max_decoded_replay"},
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
