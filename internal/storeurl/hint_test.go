package storeurl

import (
	"strings"
	"testing"
)

func TestParseSuggestsTheScheme(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ url, want string }{
		{"sqlite:/tmp/x.db", "write sqlite:///tmp/x.db for the absolute path /tmp/x.db"},
		{"sqlite:idem.db", "write sqlite://idem.db for a path relative"},
		{"postgres:idem:secret@db/idem", "needs // after postgres:"},
		{"idem.db", "has no scheme"},
	} {
		_, err := Parse(tt.url)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tt.url, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q) shows the password: %v", tt.url, err)
		}
	}
}
