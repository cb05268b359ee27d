package storeurl

import (
	"strings"
	"testing"
)

func TestParseBatch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url     string
		off     bool
		wantErr string
	}{
		{url: "sqlite://x.db", off: false},
		{url: "sqlite://x.db?batch=on", off: false},
		{url: "sqlite://x.db?batch=off&synchronous=full", off: true},
		{url: "sqlite://x.db?batch=no", wantErr: `batch must be on or off, got "no"`},
		{url: "postgres://u@127.0.0.1:5432/idem?sslmode=disable", off: false},
		{url: "postgres://u@127.0.0.1:5432/idem?batch=off&sslmode=disable&schema=s", off: true},
		{url: "postgres://u@127.0.0.1:5432/idem?batch=OFF", wantErr: "batch must be on or off"},
		{url: "postgres://u@127.0.0.1:5432/idem?batch=", wantErr: "batch must not be empty"},
		{url: "mysql://root@tcp(127.0.0.1:3306)/idem", off: false},
		{url: "mysql://root@tcp(127.0.0.1:3306)/idem?batch=off&interpolateParams=true", off: true},
		{url: "mysql://root@tcp(127.0.0.1:3306)/idem?batch=1", wantErr: "batch must be on or off"},
	} {
		tg, err := Parse(c.url)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("Parse(%q) error = %v, want one containing %q", c.url, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Parse(%q): %v", c.url, err)
			continue
		}
		if tg.batchOff != c.off {
			t.Errorf("Parse(%q): batch off = %v, want %v", c.url, tg.batchOff, c.off)
		}
		// The parameter is idem's own: it must not reach the server as a
		// setting or a session variable.
		switch tg.Kind {
		case KindPostgres:
			if _, ok := tg.pg.ConnConfig.RuntimeParams["batch"]; ok {
				t.Errorf("Parse(%q): batch left in the server settings", c.url)
			}
			if c.off && tg.pgSchema != "s" {
				t.Errorf("Parse(%q): schema %q, want s", c.url, tg.pgSchema)
			}
		case KindMySQL:
			if _, ok := tg.my.Params["batch"]; ok {
				t.Errorf("Parse(%q): batch left in the session variables", c.url)
			}
		}
	}
}
