package idemproxy_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

func TestLogsEscapeTerminalControls(t *testing.T) {
	t.Parallel()
	const hostile = "POST /pay\u202egnp.exe\u0085\x1b[2J\u2066x"
	for _, format := range []string{"json", "text"} {
		var buf bytes.Buffer
		log, err := idemproxy.NewLogger(&buf, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		log.Info("request", "operation", hostile)
		line := buf.String()
		for _, raw := range []string{"\u202e", "\u0085", "\x1b", "\u2066"} {
			if strings.Contains(line, raw) {
				t.Errorf("%s: the log line holds %q raw: %q", format, raw, line)
			}
		}
		if format == "json" {
			var rec map[string]any
			if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
				t.Fatalf("not JSON: %v: %s", err, line)
			}
			if rec["operation"] != hostile {
				t.Errorf("the JSON line decodes to %q, not the value logged", rec["operation"])
			}
		}
	}
}
