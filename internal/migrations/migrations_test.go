package migrations_test

import (
	"testing"
	"testing/fstest"

	"github.com/idem-dev/idem/internal/migrations"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"m/0002_index.sql": {Data: []byte("CREATE INDEX i;")},
		"m/0001_init.sql":  {Data: []byte("CREATE TABLE t;")},
		"m/README":         {Data: []byte("not a migration")},
	}
	ms, err := migrations.Load(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Version != 1 || ms[0].Name != "0001_init" || ms[0].SQL != "CREATE TABLE t;" || ms[1].Version != 2 {
		t.Fatalf("Load = %+v", ms)
	}
	for name, bad := range map[string]fstest.MapFS{
		"no version":        {"m/init.sql": {}},
		"zero version":      {"m/0000_x.sql": {}},
		"duplicate version": {"m/0001_a.sql": {}, "m/1_b.sql": {}},
	} {
		if _, err := migrations.Load(bad, "m"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
