package idemseal_test

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemseal"
)

var (
	b64 = base64.StdEncoding.EncodeToString(secret(7))
	hx  = hex.EncodeToString(secret(8))
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		text string
		ids  []string
	}{
		{"new:" + b64, []string{"new"}},
		{"new:" + b64 + ",old:" + hx, []string{"new", "old"}},
		{" new : " + b64 + " ,\n old:" + hx + "\n", []string{"new", "old"}},
		{strings.TrimRight(b64, "="), nil}, // unpadded, derived ID
		{hx, nil},
		{"# comment\n\n2026-03.a_b:" + b64, []string{"2026-03.a_b"}},
	} {
		k, err := idemseal.ParseKeys(c.text)
		if err != nil {
			t.Errorf("ParseKeys(%q): %v", c.text, err)
			continue
		}
		if c.ids == nil {
			if !regexp.MustCompile(`^k[0-9a-f]{8}$`).MatchString(k.ID()) {
				t.Errorf("ParseKeys(%q): derived ID %q", c.text, k.ID())
			}
			continue
		}
		if got := strings.Join(k.IDs(), ","); got != strings.Join(c.ids, ",") {
			t.Errorf("ParseKeys(%q): IDs %s, want %v", c.text, got, c.ids)
		}
	}
	// A derived ID is stable, and differs between secrets.
	a, _ := idemseal.ParseKeys(b64)
	b, _ := idemseal.ParseKeys(b64)
	c, _ := idemseal.ParseKeys(hx)
	if a.ID() != b.ID() || a.ID() == c.ID() {
		t.Fatalf("derived IDs %q, %q, %q", a.ID(), b.ID(), c.ID())
	}
	// Base64 and hex of one secret are one key.
	h, _ := idemseal.ParseKeys("x:" + hex.EncodeToString(secret(7)))
	s, _ := h.SealResponse(recKey, answer)
	if _, err := mustParse(t, "x:"+b64).OpenResponse(recKey, s); err != nil {
		t.Fatalf("hex and base64 of one secret: %v", err)
	}
}

func mustParse(t *testing.T, text string) *idemseal.Keyring {
	t.Helper()
	k, err := idemseal.ParseKeys(text)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Bad keys fail with errors that say what is wrong and where, and never
// show a secret.
func TestParseKeysErrors(t *testing.T) {
	t.Parallel()
	short := base64.StdEncoding.EncodeToString(secret(3)[:16])
	long := hex.EncodeToString(append(secret(4), 5))
	for _, c := range []struct {
		text, want, secret string
	}{
		{"", "no key found", ""},
		{"# only a comment\n", "no key found", ""},
		{"a:" + short, `key 1: key "a": the secret decodes to 16 bytes; want 32`, short},
		{"a:" + b64 + ",b:" + long, `key 2: key "b": the secret decodes to 49 bytes`, long},
		{"a:not-a-key!", "neither 64 hex digits nor base64", "not-a-key!"},
		{"bad id:" + b64, "only letters", b64},
		{":" + b64, "1 to 64 characters", b64},
		{"a:" + b64 + ",a:" + hx, `key ID "a" appears twice`, hx},
	} {
		_, err := idemseal.ParseKeys(c.text)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseKeys(%q): %v; want an error with %q", c.text, err, c.want)
			continue
		}
		if c.secret != "" && strings.Contains(err.Error(), c.secret) {
			t.Errorf("ParseKeys error shows the secret: %v", err)
		}
	}
}

func TestLoadKeyFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "keys")
	line, err := idemseal.GenerateKey("2026-03")
	if err != nil {
		t.Fatal(err)
	}
	text := "\ufeff# rotated in March\n" + line + "\r\n\nold:" + b64 + "\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := idemseal.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(k.IDs(), ","); got != "2026-03,old" {
		t.Fatalf("IDs %s", got)
	}

	// The line number points at the bad line; the secret is not shown.
	if err := os.WriteFile(path, []byte("# keys\n\nnew:"+hx+"\nold:"+hx[:40]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = idemseal.LoadKeyFile(path)
	if err == nil || !strings.Contains(err.Error(), path+": line 4: key \"old\"") || strings.Contains(err.Error(), hx[:40]) {
		t.Fatalf("LoadKeyFile of a bad line: %v", err)
	}
	// In a file, a comma is not a separator.
	if err := os.WriteFile(path, []byte("a:"+b64+",b:"+hx), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := idemseal.LoadKeyFile(path); err == nil {
		t.Fatal("LoadKeyFile accepted two keys on one line")
	}
	if _, err := idemseal.LoadKeyFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadKeyFile of a missing file: %v", err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := idemseal.LoadKeyFile(big); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("LoadKeyFile of a 2 MiB file: %v", err)
	}
}

func TestGenerateKey(t *testing.T) {
	t.Parallel()
	a, err := idemseal.GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := idemseal.GenerateKey("")
	if a == b || strings.Contains(a, ":") {
		t.Fatalf("GenerateKey: %q, %q", a, b)
	}
	k := mustParse(t, a)
	s, _ := k.SealResponse(recKey, answer)
	if got, err := k.OpenResponse(recKey, s); err != nil || !sameResponse(got, answer) {
		t.Fatalf("a generated key does not round-trip: %v", err)
	}
	if _, err := idemseal.GenerateKey("no spaces"); err == nil {
		t.Fatal("GenerateKey accepted a bad ID")
	}
}
