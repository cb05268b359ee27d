package idemadmin

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// MinTokenLength is the shortest admin token accepted, in bytes. Generate
// tokens with, for instance, `openssl rand -hex 32`.
const MinTokenLength = 16

// DefaultTokenName names a token written without a name.
const DefaultTokenName = "admin"

// ParseTokens reads admin tokens, one per line: "NAME:TOKEN", or a bare
// TOKEN, which is named "admin". The name is what the audit log and the
// records show as who made a change. Blank lines and lines starting with #
// are ignored; a token that itself contains ':' must be written with its
// name. Tokens are visible ASCII, at least MinTokenLength bytes; names are
// letters, digits and ._@- (at most 64). Duplicate names or tokens are
// errors.
func ParseTokens(text string) (map[string]string, error) {
	tokens := map[string]string{}
	seen := map[string]bool{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, tok := DefaultTokenName, line
		if n, t, ok := strings.Cut(line, ":"); ok && validName(n) {
			name, tok = n, t
		}
		if err := checkToken(tok); err != nil {
			return nil, fmt.Errorf("line %d: token %q: %w", i+1, name, err)
		}
		if _, dup := tokens[name]; dup {
			return nil, fmt.Errorf("line %d: the name %q is given twice", i+1, name)
		}
		if seen[tok] {
			return nil, fmt.Errorf("line %d: token %q is the same as an earlier one", i+1, name)
		}
		tokens[name], seen[tok] = tok, true
	}
	if len(tokens) == 0 {
		return nil, errors.New("no token found (write one per line: NAME:TOKEN, or a bare TOKEN)")
	}
	return tokens, nil
}

// LoadTokenFile reads admin tokens from the file at path (see ParseTokens).
func LoadTokenFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("admin token file: %w", err)
	}
	tokens, err := ParseTokens(string(b))
	if err != nil {
		return nil, fmt.Errorf("admin token file %s: %w", path, err)
	}
	return tokens, nil
}

func validName(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._@-", c) >= 0) {
			return false
		}
	}
	return true
}

func checkToken(tok string) error {
	if len(tok) < MinTokenLength {
		return fmt.Errorf("too short (%d bytes; at least %d, e.g. openssl rand -hex 32)", len(tok), MinTokenLength)
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] <= ' ' || tok[i] >= 0x7f {
			return errors.New("holds a character that is not visible ASCII")
		}
	}
	return nil
}
