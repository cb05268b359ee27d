package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

func TestParseKeyHeader(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", idem.MaxKeyLength)
	cases := []struct {
		name    string
		values  []string
		want    string
		wantErr error
	}{
		{"bare token", []string{"abc-123"}, "abc-123", nil},
		{"uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"sf-string", []string{`"abc"`}, "abc", nil},
		{"sf-string with escapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"surrounding spaces", []string{"  abc\t"}, "abc", nil},
		{"255 bytes", []string{long}, long, nil},
		{"missing", nil, "", idem.ErrMissingKey},
		{"empty", []string{""}, "", idem.ErrInvalidKey},
		{"only spaces", []string{"   "}, "", idem.ErrInvalidKey},
		{"empty sf-string", []string{`""`}, "", idem.ErrInvalidKey},
		{"256 bytes", []string{long + "k"}, "", idem.ErrInvalidKey},
		{"two headers", []string{"a", "b"}, "", idem.ErrInvalidKey},
		{"comma list", []string{"a, b"}, "", idem.ErrInvalidKey},
		{"sf-string list", []string{`"a", "b"`}, "", idem.ErrInvalidKey},
		{"control character", []string{"ab\x01c"}, "", idem.ErrInvalidKey},
		{"newline", []string{"ab\nc"}, "", idem.ErrInvalidKey},
		{"DEL", []string{"ab\x7f"}, "", idem.ErrInvalidKey},
		{"non-ASCII", []string{"clé"}, "", idem.ErrInvalidKey},
		{"inner space", []string{"a b"}, "", idem.ErrInvalidKey},
		{"quoted inner space", []string{`"a b"`}, "", idem.ErrInvalidKey},
		{"unterminated sf-string", []string{`"abc`}, "", idem.ErrInvalidKey},
		{"bad escape", []string{`"a\nb"`}, "", idem.ErrInvalidKey},
		{"text after sf-string", []string{`"abc"def`}, "", idem.ErrInvalidKey},
		{"sf-string parameters", []string{`"abc";x=1`}, "", idem.ErrInvalidKey},
		{"non-ASCII in sf-string", []string{"\"cl\xc3\xa9\""}, "", idem.ErrInvalidKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := idem.ParseKeyHeader(tc.values)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("ParseKeyHeader(%q) error = %v, want %v", tc.values, err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("ParseKeyHeader(%q) = %q, want %q", tc.values, got, tc.want)
			}
			if err != nil {
				var ke *idem.KeyError
				if !errors.As(err, &ke) || ke.Reason == "" {
					t.Fatalf("error %v is not a *KeyError with a reason", err)
				}
			}
		})
	}
}
