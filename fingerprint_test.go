package idem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

func canon(t *testing.T, s string, exclude ...string) string {
	t.Helper()
	out, err := idem.CanonicalJSON(nil, []byte(s), exclude)
	if err != nil {
		t.Fatalf("CanonicalJSON(%q): %v", s, err)
	}
	return string(out)
}

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\t\"a\" : [ 1 , 2 ] } ", `{"a":[1,2]}`},
		{`{"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]}`, `{"a":[{"c":2,"d":1}],"z":{"x":2,"y":1}}`},
		{`1.0`, `1`},
		{`100`, `1e2`},
		{`1.5e3`, `15e2`},
		{`-0.0`, `0`},
		{`0.001`, `1e-3`},
		{`12345678901234567890123`, `12345678901234567890123`},
		{`"\u00e9\/\n\u0001"`, "\"\u00e9/\\u000a\\u0001\""},
		{`"\ud83d\ude00"`, "\"\U0001F600\""},
		{`[true,false,null]`, `[true,false,null]`},
		{`{}`, `{}`},
		{`[]`, `[]`},
	}
	for _, tc := range cases {
		if got := canon(t, tc.in); got != tc.want {
			t.Errorf("CanonicalJSON(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCanonicalJSONSameMeaning(t *testing.T) {
	t.Parallel()
	groups := [][]string{
		{`{"amount":100,"currency":"usd"}`, `{"currency":"usd","amount":100}`, `{ "currency" : "usd" , "amount" : 1e2 }`, `{"currency":"\u0075sd","amount":100.000}`},
		{`[1,2,3]`, `[ 1, 2.0, 3e0 ]`, `[0.1e1,20e-1,300E-2]`},
	}
	for _, g := range groups {
		want := canon(t, g[0])
		for _, s := range g[1:] {
			if got := canon(t, s); got != want {
				t.Errorf("%q canonicalises to %q, but %q to %q", g[0], want, s, got)
			}
		}
	}
	different := [][2]string{
		{`{"a":1}`, `{"a":"1"}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":1}`, `{"a":1,"b":null}`},
		{`1`, `-1`},
		{`0.1`, `0.01`},
	}
	for _, d := range different {
		if canon(t, d[0]) == canon(t, d[1]) {
			t.Errorf("%q and %q canonicalise equally", d[0], d[1])
		}
	}
}

func TestCanonicalJSONExclude(t *testing.T) {
	t.Parallel()
	got := canon(t, `{"amount":1,"meta":{"trace":"x","keep":2},"items":[{"ts":1},{"ts":2}],"a/b":3,"m~n":4}`,
		"/meta/trace", "/items/1/ts", "/a~1b", "/m~0n")
	want := `{"amount":1,"items":[{"ts":1},{}],"meta":{"keep":2}}`
	if got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	got = canon(t, `[1,2,3]`, "/1")
	if got != `[1,null,3]` {
		t.Fatalf("array exclusion: got %s", got)
	}
	if _, err := idem.CanonicalJSON(nil, []byte(`{}`), []string{"meta"}); err == nil {
		t.Fatal("a pointer without a leading slash was accepted")
	}
}

func TestCanonicalJSONRejects(t *testing.T) {
	t.Parallel()
	bad := []string{
		``, `{`, `{"a"}`, `{"a":1,}`, `[1,]`, `01`, `1.`, `1e`, `-`, `"abc`, `"\x"`, `"\u12"`,
		`"\ud800"`, "\"a\x01b\"", "\"\xff\"", `{} {}`, `tru`, `nul`, `{"a":1}x`, `1e99999999999999999999`,
		strings.Repeat("[", 600) + strings.Repeat("]", 600),
	}
	for _, s := range bad {
		if out, err := idem.CanonicalJSON(nil, []byte(s), nil); err == nil {
			t.Errorf("CanonicalJSON(%q) = %q, want an error", s, out)
		}
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := idem.FingerprintInput{Method: "POST", Operation: "POST /payments", Query: "a=1&b=2", ContentType: "application/json", Body: []byte(`{"amount":100,"currency":"usd"}`)}
	fp := func(in idem.FingerprintInput, exclude ...string) string {
		t.Helper()
		s, err := idem.Fingerprint(in, idem.FingerprintOptions{ExcludeFields: exclude})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	want := fp(base)
	if !strings.HasPrefix(want, idem.FingerprintVersion+":") || len(want) != len("v1:")+64 {
		t.Fatalf("fingerprint %q is not versioned SHA-256 hex", want)
	}
	same := []idem.FingerprintInput{
		{Method: "post", Operation: base.Operation, Query: "b=2&a=1", ContentType: "application/json; charset=utf-8", Body: []byte(` {"currency":"usd", "amount":1e2} `)},
		{Method: "POST", Operation: base.Operation, Query: base.Query, ContentType: "application/vnd.api+json", Body: []byte(`{"currency":"usd","amount":100.0}`)},
	}
	for _, in := range same {
		if got := fp(in); got != want {
			t.Errorf("%+v: fingerprint differs", in)
		}
	}
	mod := func(f func(*idem.FingerprintInput)) idem.FingerprintInput {
		in := base
		f(&in)
		return in
	}
	differ := map[string]idem.FingerprintInput{
		"method":                 mod(func(in *idem.FingerprintInput) { in.Method = "PATCH" }),
		"operation":              mod(func(in *idem.FingerprintInput) { in.Operation = "POST /refunds" }),
		"query":                  mod(func(in *idem.FingerprintInput) { in.Query = "a=1&b=3" }),
		"path":                   mod(func(in *idem.FingerprintInput) { in.Path = "/orders/2" }),
		"query order of repeats": {Method: "POST", Operation: base.Operation, Query: "a=2&a=1&b=2", ContentType: base.ContentType, Body: base.Body},
		"body":                   mod(func(in *idem.FingerprintInput) { in.Body = []byte(`{"amount":101,"currency":"usd"}`) }),
		"not json":               mod(func(in *idem.FingerprintInput) { in.ContentType = "text/plain" }),
	}
	for name, in := range differ {
		if fp(in) == want {
			t.Errorf("%s: fingerprint unchanged", name)
		}
	}
	// Excluded fields do not count.
	a := mod(func(in *idem.FingerprintInput) { in.Body = []byte(`{"amount":100,"trace":"a"}`) })
	b := mod(func(in *idem.FingerprintInput) { in.Body = []byte(`{"trace":"b","amount":100}`) })
	if fp(a, "/trace") != fp(b, "/trace") {
		t.Error("excluded field changed the fingerprint")
	}
	if fp(a) == fp(b) {
		t.Error("field changed nothing without exclusion")
	}
	// Invalid JSON is hashed raw, and never equals valid JSON of other bytes.
	inv := mod(func(in *idem.FingerprintInput) { in.Body = []byte(`{"amount":`) })
	if fp(inv) == fp(mod(func(in *idem.FingerprintInput) { in.Body = []byte(`{"amount": `) })) {
		t.Error("different invalid bodies fingerprint equally")
	}
	if _, err := idem.Fingerprint(base, idem.FingerprintOptions{ExcludeFields: []string{"trace"}}); err == nil {
		t.Error("bad JSON Pointer accepted")
	}
}

func TestKeyErrorIs(t *testing.T) {
	t.Parallel()
	err := idem.ValidateKey(strings.Repeat("x", 300))
	if !errors.Is(err, idem.ErrInvalidKey) || !strings.Contains(err.Error(), "300") {
		t.Fatalf("err = %v", err)
	}
}

func TestFingerprintKeyed(t *testing.T) {
	t.Parallel()
	in := idem.FingerprintInput{Method: "POST", Operation: "POST /payments", ContentType: "application/json", Body: []byte(`{"amount":100}`)}
	fp := func(key string, in idem.FingerprintInput) string {
		t.Helper()
		s, err := idem.Fingerprint(in, idem.FingerprintOptions{Key: []byte(key)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	plain, a, a2, b := fp("", in), fp("secret-a", in), fp("secret-a", in), fp("secret-b", in)
	if !strings.HasPrefix(a, "v1k:") || len(a) != len("v1k:")+64 {
		t.Fatalf("keyed fingerprint %q is not v1k: and 64 hex digits", a)
	}
	if a != a2 {
		t.Fatal("the same key gave two fingerprints")
	}
	if a == b || strings.TrimPrefix(a, "v1k:") == strings.TrimPrefix(plain, "v1:") {
		t.Fatalf("keyed fingerprints do not depend on the key: plain %s, a %s, b %s", plain, a, b)
	}
	// The pooled HMAC follows the key from call to call.
	if fp("secret-b", in) != b || fp("secret-a", in) != a || fp("", in) != plain {
		t.Fatal("a pooled state kept an earlier key")
	}
	// Canonicalisation still applies.
	same := in
	same.Body = []byte(` {"amount":1e2} `)
	if fp("secret-a", same) != a {
		t.Fatal("keyed fingerprint is not canonical")
	}
}
