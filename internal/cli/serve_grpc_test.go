package cli

import (
	"io"
	"strings"
	"testing"
)

// TestServeProtocolFlags: the TLS and gRPC flags reach the configuration:
// a half-set TLS pair, a bad --grpc-streams, or files that do not load
// stop idem serve before it serves.
func TestServeProtocolFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ args, want string }{
		{"--tls-cert c.pem", "tls_key"},
		{"--tls-client-ca ca.pem", "tls_cert"},
		{"--grpc-streams sometimes", "grpc_streams"},
		{"--tls-cert /nonexistent/c.pem --tls-key /nonexistent/k.pem --store memory:// --listen 127.0.0.1:0", "nonexistent"},
		{"--proto-descriptor-set /nonexistent/s.binpb --store memory:// --listen 127.0.0.1:0", "proto_descriptor_set"},
	} {
		cmd := newServeCmd()
		cmd.SetArgs(append([]string{"--upstream", "h2c://127.0.0.1:1"}, strings.Fields(tc.args)...))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.args, err, tc.want)
		}
	}
}
