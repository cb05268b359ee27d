package storeurl

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestCheckExisting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "idem.db")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"sqlite://" + file, true},
		{"sqlite://" + filepath.Join(dir, "nosuch.db"), false},
		{"sqlite://" + dir, false},
		{"memory://", false},
		{"postgres://u@127.0.0.1:1/db", true},
	} {
		tg, err := Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		err = tg.CheckExisting()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrNoStore)) {
			t.Errorf("CheckExisting(%s) = %v, want ok=%v", tc.url, err, tc.ok)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "nosuch.db")); err == nil {
		t.Error("CheckExisting created the file")
	}
}
