package idemadmin

import (
	"errors"
	"fmt"
	"os"
	"sort"
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
// are ignored, and so are a byte order mark and the carriage returns of a
// file written on Windows; a token that itself contains ':' must be
// written with its name. Tokens are visible ASCII, at least
// MinTokenLength bytes; names are letters, digits and ._@- (at most 64).
// Duplicate names or tokens are errors.
func ParseTokens(text string) (map[string]string, error) {
	tokens := map[string]string{}
	seen := map[string]bool{}
	for i, line := range strings.Split(strings.TrimPrefix(text, bom), "\n") {
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

// unambiguous refuses tokens that could sign in under two names: the
// same token under two names (a token file and IDEM_ADMIN_TOKEN, say), a
// token that is another's name (typed alone, the name would sign in), or
// one that reads as another token's whole NAME:TOKEN line.
func unambiguous(tokens map[string]string) error {
	names := make([]string, 0, len(tokens))
	for name := range tokens {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, a := range names {
		for _, b := range names {
			switch ta, tb := tokens[a], tokens[b]; {
			case a < b && ta == tb:
				return fmt.Errorf("tokens %q and %q are the same token", a, b)
			case ta == b:
				return fmt.Errorf("token %q is also the name of a token: that name, typed alone, would sign in", a)
			case ta == b+":"+tb:
				return fmt.Errorf("token %q reads as the line %q:TOKEN of token %q", a, b, b)
			}
		}
	}
	return nil
}

// Credential reads what an operator was told to give a command that
// speaks to the admin API: one token, bare or as a NAME:TOKEN line of the
// token file (blank lines and # comments around it are ignored), and
// returns it, trimmed, as the API accepts it. The line is passed on whole
// rather than split here, so that the server reads it as it reads its own
// token file: a token that contains ':' is never cut at the wrong colon.
func Credential(text string) (string, error) {
	tokens, err := ParseTokens(text)
	if err != nil {
		return "", err
	}
	if len(tokens) != 1 {
		return "", fmt.Errorf("%d tokens found; give just the one to use", len(tokens))
	}
	for _, line := range strings.Split(strings.TrimPrefix(text, bom), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	return "", errors.New("no token found")
}

// bom is the byte order mark some editors write at the start of a file.
const bom = "\ufeff"

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
