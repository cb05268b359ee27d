package idemproxy_test

import (
	"log/slog"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// FuzzParseConfig feeds the config parser arbitrary YAML: it returns a
// config or an error, never panics, and a config it accepts either
// validates and builds a proxy, or is refused with an error.
func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		"upstream: http://127.0.0.1:3000\n",
		"upstream: http://x\nscope_header: [Authorization, X-Tenant]\nscope_cookie: session\nanonymous: shared\n",
		"upstream: http://x\nroutes:\n  - match: POST /payments/{id}/refund\n    wait: 2s\n    ambiguous: release\n  - match: /webhooks/\n    disabled: true\n",
		"upstream: http://x\nroutes:\n  - match: POST /a\n  - match: POST /a\n",
		"upstream: http://x\nrelease_statuses: [429, 503]\nmax_body: 4096\nlease: 1s\nretention: 1h\n",
		"upstream: http://x\nread_timeout: 5s\nmax_header_bytes: 1024\nscope_secret_file: /nonexistent\n",
		"routes: [{match: \"GET /{x...}\"}]\n",
		"routes: [{match: \" /\"}, {match: \"PUT\\t/a\"}]\n",
		"routes: [{match: /{x...}}, {match: POST /a}]\n",
		"upstream: &a http://x\nlisten: *a\n",
		"{",
		"- - -",
	} {
		f.Add([]byte(seed))
	}
	store := idemmem.MustNew(idemmem.Config{})
	f.Cleanup(func() { store.Close() })
	engine, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 64<<10 {
			return
		}
		c, err := idemproxy.ParseConfig(b)
		if err != nil {
			return
		}
		c.Upstream = "http://127.0.0.1:1"
		c = c.WithDefaults()
		if c.Validate() != nil {
			return
		}
		idemproxy.New(engine, c, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
	})
}
