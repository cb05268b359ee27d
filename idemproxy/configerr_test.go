package idemproxy_test

import (
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

func TestConfigErrorsForPeople(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, yaml, want string }{
		{"misspelt field", "upstream: http://u\nretension: 24h\n", `line 2: unknown field "retension" (did you mean retention?)`},
		{"misspelt route field", "upstream: http://u\nroutes:\n  - match: POST /p\n    exlude_fields: [/a]\n", `line 4: unknown field "exlude_fields" (did you mean exclude_fields?)`},
		{"route-only field at the top", "upstream: http://u\ndisable: true\n", `line 2: unknown field "disable"`},
		{"far from anything", "upstream: http://u\nzzzzzzzzzz: 1\n", `line 2: unknown field "zzzzzzzzzz"`},
		{"two misspellings", "upstream: http://u\nlisen: a\nstroe: b\n", `line 2: unknown field "lisen" (did you mean listen?); line 3: unknown field "stroe" (did you mean store?)`},
		{"duplicate route", "upstream: http://u\nroutes:\n  - match: POST /a\n  - match: POST /b\n  - match: POST /a\n    wait: 1s\n", `line 5: route "POST /a" conflicts with the route on line 3 ("POST /a"):`},
		{"overlapping routes", "upstream: http://u\nroutes:\n  - match: POST /a/{x}\n  - match: POST /{y}/b\n", `line 4: route "POST /{y}/b" conflicts with the route on line 3`},
		{"upstream without scheme", "upstream: 127.0.0.1:3000\n", `upstream "127.0.0.1:3000" has no scheme: add http:// (--upstream http://127.0.0.1:3000)`},
		{"host:port upstream", "upstream: localhost:3000\n", `add http://`},
		{"ftp upstream", "upstream: ftp://h/\n", `must be an http:// or https:// URL`},
	}
	for _, tt := range tests {
		c, err := idemproxy.ParseConfig([]byte(tt.yaml))
		if err == nil {
			err = c.WithDefaults().Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
			continue
		}
		for _, leak := range []string{".go:", "idemproxy.", "not found in type"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%s: the error shows %q: %v", tt.name, leak, err)
			}
		}
		if strings.Contains(tt.name, "far") && strings.Contains(err.Error(), "did you mean") {
			t.Errorf("%s: a suggestion for a name close to nothing: %v", tt.name, err)
		}
	}
}
