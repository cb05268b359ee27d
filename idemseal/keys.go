package idemseal

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// maxKeyFile bounds what LoadKeyFile reads: far more than any ring of keys.
const maxKeyFile = 1 << 20

// LoadKeyFile reads a Keyring from the file at path, in the format of the
// package documentation: one [ID:]SECRET a line, the first one sealing.
// Errors name the file, the line and the key ID, never a secret.
func LoadKeyFile(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("idemseal: encryption key file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("idemseal: encryption key file %s: %w", path, err)
	}
	defer clear(b)
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("idemseal: encryption key file %s is over %d bytes; it should hold a few lines", path, maxKeyFile)
	}
	k, err := parse(string(b), false)
	if err != nil {
		return nil, fmt.Errorf("idemseal: encryption key file %s: %w", path, err)
	}
	return k, nil
}

// ParseKeys reads a Keyring from text in the key file's format, where a
// comma separates keys as well as a line break, so that one environment
// variable can hold a ring: IDEM_ENCRYPTION_KEY="new:SECRET,old:SECRET".
// Errors name the key by position and ID, never a secret.
func ParseKeys(text string) (*Keyring, error) {
	k, err := parse(text, true)
	if err != nil {
		return nil, fmt.Errorf("idemseal: %w", err)
	}
	return k, nil
}

func parse(text string, commas bool) (*Keyring, error) {
	text = strings.TrimPrefix(text, "\ufeff") // a byte order mark some editors write
	entries := strings.Split(text, "\n")
	if commas {
		entries = strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == ',' })
	}
	var keys []Key
	for i, line := range entries {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		where := fmt.Sprintf("line %d", i+1)
		if commas {
			where = fmt.Sprintf("key %d", len(keys)+1)
		}
		key, err := parseKey(line)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("no key found; want one [ID:]SECRET a line, SECRET being 32 random bytes in base64 (openssl rand -base64 32) or hex (openssl rand -hex 32)")
	}
	return New(keys...)
}

// parseKey reads [ID:]SECRET.
func parseKey(s string) (Key, error) {
	var k Key
	if id, secret, ok := strings.Cut(s, ":"); ok {
		k.ID = strings.TrimSpace(id)
		if err := ValidID(k.ID); err != nil {
			return Key{}, err
		}
		s = strings.TrimSpace(secret)
	}
	secret, err := decodeSecret(s)
	if err != nil {
		if k.ID != "" {
			return Key{}, fmt.Errorf("key %q: %w", k.ID, err)
		}
		return Key{}, err
	}
	if k.ID == "" {
		k.ID = derivedID(secret)
	}
	k.Secret = secret
	return k, nil
}

// decodeSecret reads 64 hex digits, or base64 (standard alphabet, padded
// or not) of KeySize bytes.
func decodeSecret(s string) ([]byte, error) {
	if len(s) == 2*KeySize {
		if b, err := hex.DecodeString(s); err == nil {
			return b, nil
		}
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		b, err = base64.RawStdEncoding.DecodeString(s)
	}
	if err != nil {
		return nil, fmt.Errorf("the secret (%d characters) is neither 64 hex digits nor base64; generate one with openssl rand -base64 32", len(s))
	}
	if len(b) != KeySize {
		return nil, fmt.Errorf("the secret decodes to %d bytes; want %d random bytes (AES-256), as from openssl rand -base64 32", len(b), KeySize)
	}
	return b, nil
}

// derivedID names a key given without an ID: "k" and 8 hex digits of a
// hash of the secret, which tell keys apart without revealing anything
// usable about them.
func derivedID(secret []byte) string {
	h := sha256.New()
	h.Write([]byte("idemseal key id\x00"))
	h.Write(secret)
	return "k" + hex.EncodeToString(h.Sum(nil)[:4])
}

// GenerateKey returns a new key line for a key file or ParseKeys: id, a
// colon, and 32 random bytes in base64. With an empty id the line is the
// secret alone, and the ID is derived from it.
func GenerateKey(id string) (string, error) {
	if id != "" {
		if err := ValidID(id); err != nil {
			return "", fmt.Errorf("idemseal: %w", err)
		}
		id += ":"
	}
	secret := make([]byte, KeySize)
	_, _ = rand.Read(secret) // never fails (crypto/rand)
	return id + base64.StdEncoding.EncodeToString(secret), nil
}
