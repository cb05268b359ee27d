package idem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idem-dev/idem"
)

func FuzzParseKeyHeader(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, "a,b", "", " ", "\x00", "é", `"`, `"\`, `"a";b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := idem.ParseKeyHeader([]string{v})
		if err != nil {
			return
		}
		if err := idem.ValidateKey(k); err != nil {
			t.Fatalf("ParseKeyHeader(%q) = %q, which ValidateKey refuses: %v", v, k, err)
		}
		// A valid key sent back as an sf-string means the same; so does a
		// bare token, unless it starts with a quote (then it is an sf-string).
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if k2, err := idem.ParseKeyHeader([]string{quoted}); err != nil || k2 != k {
			t.Fatalf("quoted %q reparsed as %q, %v", quoted, k2, err)
		}
		if k[0] != '"' && !strings.Contains(k, ",") {
			if k2, err := idem.ParseKeyHeader([]string{k}); err != nil || k2 != k {
				t.Fatalf("bare %q reparsed as %q, %v", k, k2, err)
			}
		}
	})
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2.50,{"c":null}]}`, `"\u00e9"`, `1e-7`, `[]`, `{"a":{"a":{"a":1}}}`, `-0`, `"\ud83d\ude00"`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c1, err := idem.CanonicalJSON(nil, in, nil)
		if err != nil {
			return
		}
		// Stable: canonicalising again gives the same bytes.
		c2, err := idem.CanonicalJSON(nil, c1, nil)
		if err != nil {
			t.Fatalf("canonical form %q does not parse: %v", c1, err)
		}
		if string(c1) != string(c2) {
			t.Fatalf("not stable: %q -> %q -> %q", in, c1, c2)
		}
		if !utf8.Valid(c1) {
			t.Fatalf("canonical form is not UTF-8: %q", c1)
		}
		// Whatever the canonicaliser accepts, encoding/json accepts too.
		if !json.Valid(in) {
			t.Fatalf("accepted invalid JSON %q", in)
		}
		// Same meaning, same form: encoding/json (numbers kept as written)
		// re-spells the text with sorted members and no whitespace.
		if containsTwinNames(in) {
			return // encoding/json keeps only the last duplicate; twins keep their order
		}
		dec := json.NewDecoder(bytes.NewReader(in))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json cannot decode %q: %v", in, err)
		}
		re, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		c3, err := idem.CanonicalJSON(nil, re, nil)
		if err != nil {
			t.Fatalf("re-encoding %q does not canonicalise: %v", re, err)
		}
		if string(c3) != string(c1) {
			t.Fatalf("%q and its re-encoding %q canonicalise differently: %q vs %q", in, re, c1, c3)
		}
	})
}

// containsTwinNames reports an object with two members whose names fold
// alike (see CanonicalJSON): duplicates, or names equal but for case, '_'
// and '-'.
func containsTwinNames(in []byte) bool {
	strip := strings.NewReplacer("_", "", "-", "")
	var walk func(d *json.Decoder) bool
	walk = func(d *json.Decoder) bool {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			var seen []string
			for d.More() {
				k, _ := d.Token()
				ks, _ := k.(string)
				ks = strip.Replace(ks)
				for _, s := range seen {
					if strings.EqualFold(s, ks) {
						return true
					}
				}
				seen = append(seen, ks)
				if walk(d) {
					return true
				}
			}
			_, _ = d.Token()
		case json.Delim('['):
			for d.More() {
				if walk(d) {
					return true
				}
			}
			_, _ = d.Token()
		}
		return false
	}
	return walk(json.NewDecoder(bytes.NewReader(in)))
}

// FuzzFingerprintMeaning is a differential test of the fingerprint: two
// requests that share a fingerprint must mean the same to the parser their
// Content-Type calls for. It fingerprints the two inputs and variants of
// the first (JSON re-spelled with members reversed and strings escaped;
// a multipart body under another boundary; a query with escapes), and
// checks every pair that shares a fingerprint:
//
//   - JSON: encoding/json reads equal values, with and without UseNumber,
//     and so do a reader that keeps the first of duplicate names and one
//     that matches names case-insensitively, ignoring '_' and '-';
//   - forms and queries: url.ParseQuery reads equal values, and the
//     parameters, split on '&' and percent-decoded, are equal in order;
//   - multipart: mime/multipart reads equal parts, raw and decoded.
func FuzzFingerprintMeaning(f *testing.F) {
	f.Add(uint8(0), []byte(`{"amount":1,"amount":1000}`), []byte(`{"amount":1000,"amount":1}`), "", "", uint8(0))
	f.Add(uint8(0), []byte(`{"amount":1,"Amount":1000}`), []byte(`{"Amount":1000,"amount":1}`), "", "", uint8(1))
	f.Add(uint8(0), []byte(`{"a":{"x":1},"a":{"y":2},"user_id":1,"userId":2}`), []byte(`{"a":{"y":2}}`), "", "", uint8(2))
	f.Add(uint8(0), []byte(`[1,1.0,1e0,-0,0,1E+0,12345678901234567890123456789,1e400]`), []byte(`[1,1,1,0,0,1,12345678901234567890123456789,1e500]`), "", "", uint8(3))
	f.Add(uint8(0), []byte(`{"s":"\u0041\ud83d\ude00\/é","t":"\ud800"}`), []byte("{\"s\":\"A\U0001F600/\u00e9\",\"t\":\"\xed\xa0\x80\"}"), "", "", uint8(0))
	f.Add(uint8(1), []byte("amount=5&currency=usd&a=b+c&d=%41"), []byte("currency=usd&amount=5&a=b%20c&d=A"), "", "", uint8(0))
	f.Add(uint8(2), []byte("--AAA\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n100\r\n--AAA--\r\n"), []byte("--BBB\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n999\r\n--BBB--\r\n--AAA\r\n\r\n1\r\n--AAA--"), "AAA", "BBB", uint8(0))
	f.Add(uint8(2), []byte("--A\r\n\r\nxAx\r\n--A--"), []byte("--AA\r\n\r\n1\r\n--AA--"), "A", "AA", uint8(1))
	f.Add(uint8(3), []byte("a=%41&b=%2b&c=+&items[][a]=1&items[][b]=2"), []byte("b=%2B&a=A&c=%20"), "", "", uint8(5))
	f.Fuzz(func(t *testing.T, kind uint8, a, b []byte, ba, bb string, seed uint8) {
		type cand struct {
			in  idem.FingerprintInput
			why string
		}
		req := func(ct string, body []byte, why string) cand {
			return cand{idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: ct, Body: body}, why}
		}
		var cands []cand
		var meaning func(c cand) any
		switch kind % 4 {
		case 0:
			cands = []cand{req("application/json", a, "a"), req("application/json", b, "b")}
			if v, ok := respellJSON(a, seed); ok {
				cands = append(cands, req("application/json", v, "a re-spelled"))
			}
			meaning = func(c cand) any { return jsonMeanings(c.in.Body) }
		case 1:
			const form = "application/x-www-form-urlencoded"
			cands = []cand{req(form, a, "a"), req(form, b, "b")}
			if v, err := url.ParseQuery(string(a)); err == nil {
				cands = append(cands, req(form, []byte(v.Encode()), "a re-encoded"))
			}
			meaning = func(c cand) any { return queryMeanings(string(c.in.Body)) }
		case 2:
			ctA := mime.FormatMediaType("multipart/form-data", map[string]string{"boundary": ba})
			ctB := mime.FormatMediaType("multipart/form-data", map[string]string{"boundary": bb})
			cands = []cand{req(ctA, a, "a"), req(ctB, b, "b")}
			if ba != "" {
				cands = append(cands, req(ctB, bytes.ReplaceAll(a, []byte(ba), []byte(bb)), "a under b's boundary"))
			}
			meaning = func(c cand) any { return readMultipart(t, c.in.ContentType, string(c.in.Body)) }
		case 3:
			c := func(q, why string) cand {
				return cand{idem.FingerprintInput{Method: "POST", Operation: "POST /p", Query: q}, why}
			}
			cands = []cand{c(string(a), "a"), c(string(b), "b"), c(escapeSome(string(a), seed), "a with escapes")}
			meaning = func(c cand) any { return queryMeanings(c.in.Query) }
		}
		fps := make([]string, len(cands))
		for i, c := range cands {
			fps[i] = mustFingerprint(t, c.in, idem.FingerprintOptions{})
		}
		for i := range cands {
			for j := i + 1; j < len(cands); j++ {
				if fps[i] != fps[j] {
					continue
				}
				if mi, mj := meaning(cands[i]), meaning(cands[j]); !reflect.DeepEqual(mi, mj) {
					t.Fatalf("%s and %s share a fingerprint but mean different things:\n%+v\n%q\n%#v\n%+v\n%q\n%#v",
						cands[i].why, cands[j].why, cands[i].in, cands[i].in.Body, mi, cands[j].in, cands[j].in.Body, mj)
				}
			}
		}
	})
}

// jsonMeanings reads a JSON text as encoding/json does (with and without
// UseNumber), as a decoder that keeps the first of duplicate names, and as
// one that matches names case-insensitively ignoring '_' and '-', keeping
// the last. Each reading is its value, or that it failed.
func jsonMeanings(in []byte) []any {
	var plain, number any
	errPlain := json.Unmarshal(in, &plain)
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	errNumber := d.Decode(&number)
	if errNumber == nil && d.InputOffset() != int64(len(bytes.TrimRight(in, " \t\r\n"))) {
		errNumber = errors.New("trailing data")
	}
	return []any{plain, errPlain != nil, number, errNumber != nil, readJSON(in, false), readJSON(in, true)}
}

// readJSON reads a JSON text with json.Number values into maps that keep
// the first of duplicate names, or, with folded, the last of the names
// equal but for case, '_' and '-'. It returns "invalid" for what
// json.Valid refuses.
func readJSON(in []byte, folded bool) any {
	if !json.Valid(in) {
		return "invalid"
	}
	strip := strings.NewReplacer("_", "", "-", "")
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	var read func() any
	read = func() any {
		tok, _ := d.Token()
		switch tok {
		case json.Delim('{'):
			m := map[string]any{}
			for d.More() {
				k, _ := d.Token()
				name := k.(string)
				v := read()
				if folded {
					m[strings.ToUpper(strings.ToLower(strip.Replace(name)))] = v
				} else if _, ok := m[name]; !ok {
					m[name] = v
				}
			}
			d.Token()
			return m
		case json.Delim('['):
			var a []any
			for d.More() {
				a = append(a, read())
			}
			d.Token()
			return a
		}
		return tok
	}
	return read()
}

// respellJSON writes the JSON text in again with the members of each object
// reversed, whitespace added, and, as seed says, characters of strings
// escaped; numbers and literals are copied. It fails on text that
// encoding/json cannot tokenise.
func respellJSON(in []byte, seed uint8) ([]byte, bool) {
	if !json.Valid(in) || !utf8.Valid(in) {
		return nil, false
	}
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	var write func(out []byte) []byte
	str := func(out []byte, s string) []byte {
		out = append(out, '"')
		for i, r := range s {
			if r < 0x20 || r == '"' || r == '\\' || (seed>>(uint(i)%8))&1 == 1 {
				for _, u := range utf16.Encode([]rune{r}) {
					out = fmt.Appendf(out, `\u%04X`, u)
				}
				continue
			}
			out = utf8.AppendRune(out, r)
		}
		return append(out, '"')
	}
	write = func(out []byte) []byte {
		tok, _ := d.Token()
		switch tok := tok.(type) {
		case json.Delim:
			if tok == '[' {
				out = append(out, "[ "...)
				for n := 0; d.More(); n++ {
					if n > 0 {
						out = append(out, " ,\n"...)
					}
					out = write(out)
				}
				d.Token()
				return append(out, " ]"...)
			}
			var members [][]byte
			for d.More() {
				k, _ := d.Token()
				m := append(str(nil, k.(string)), " : "...)
				members = append(members, write(m))
			}
			d.Token()
			out = append(out, '{')
			for i := len(members) - 1; i >= 0; i-- {
				out = append(out, members[i]...)
				if i > 0 {
					out = append(out, ",\t"...)
				}
			}
			return append(out, '}')
		case string:
			return str(out, tok)
		case json.Number:
			return append(out, tok...)
		case bool:
			return strconv.AppendBool(out, tok)
		}
		return append(out, "null"...)
	}
	return write([]byte(" ")), true
}

// queryMeanings reads a query (or a form) as url.ParseQuery does, and as
// its parameters in order, split on '&' and decoded both as a form ('+' is
// a space) and as a URI component ('+' is '+').
func queryMeanings(q string) []any {
	vals, err := url.ParseQuery(q)
	var form, uri []string
	for p := range strings.SplitSeq(q, "&") {
		f, err1 := url.QueryUnescape(p)
		u, err2 := url.PathUnescape(p)
		form = append(form, f, fmt.Sprint(err1 != nil))
		uri = append(uri, u, fmt.Sprint(err2 != nil))
	}
	return []any{vals, err != nil, form, uri}
}

// escapeSome percent-encodes, as seed says, some of the unreserved
// characters of q, with hex digits in either case.
func escapeSome(q string, seed uint8) string {
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		c := q[i]
		unreserved := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0
		if unreserved && (seed>>(uint(i)%8))&1 == 1 {
			if i%2 == 0 {
				fmt.Fprintf(&b, "%%%02x", c)
			} else {
				fmt.Fprintf(&b, "%%%02X", c)
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
