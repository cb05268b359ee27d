package idem_test

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// fpOf fingerprints a POST with the given Content-Type, Content-Encoding
// and body.
func fpOf(t testing.TB, ct, ce, body string) string {
	t.Helper()
	return mustFingerprint(t, idem.FingerprintInput{Method: "POST", Operation: "POST /p", Path: "/p",
		ContentType: ct, ContentEncoding: ce, Body: []byte(body)}, idem.FingerprintOptions{})
}

func TestFingerprintContentType(t *testing.T) {
	t.Parallel()
	same := [][]struct{ ct, ce, body string }{
		{{"application/json", "", `{"a":"é"}`}, {"APPLICATION/Json", "", `{ "a" : "\u00e9" }`}},
		{{"application/json; charset=utf-8", "", `{"a":1}`}, {"application/json;charset=UTF-8", "", `{"a":1}`}, {`application/json; CHARSET="Utf-8"`, "", `{"a":1}`}},
		{{"text/plain; a=1; b=2", "", "x"}, {"text/plain;b=2;a=1", "", "x"}, {"TEXT/PLAIN; B=2; A=1", "", "x"}},
		{{"text/plain", "gzip", "x"}, {"text/plain", "GZIP", "x"}},
		{{"text/plain", "gzip, br", "x"}, {"text/plain", "gzip,br", "x"}, {"text/plain", " gzip ,\tbr ", "x"}},
		{{"", "", "x"}, {"", "", "x"}},
	}
	for _, g := range same {
		want := fpOf(t, g[0].ct, g[0].ce, g[0].body)
		for _, o := range g[1:] {
			if got := fpOf(t, o.ct, o.ce, o.body); got != want {
				t.Errorf("%+v and %+v: different fingerprints, want the same", g[0], o)
			}
		}
	}
	differ := []struct {
		why    string
		a, b   [3]string // Content-Type, Content-Encoding, body
		reason string
	}{
		{"form and text/plain", [3]string{"application/x-www-form-urlencoded", "", "amount=5"}, [3]string{"text/plain", "", "amount=5"}, ""},
		{"form and no Content-Type", [3]string{"application/x-www-form-urlencoded", "", "amount=5"}, [3]string{"", "", "amount=5"}, ""},
		{"json types", [3]string{"application/json", "", `[]`}, [3]string{"application/json-patch+json", "", `[]`}, ""},
		{"charset", [3]string{"text/plain; charset=utf-8", "", "x"}, [3]string{"text/plain; charset=iso-8859-1", "", "x"}, ""},
		{"charset or none", [3]string{"application/json", "", "{}"}, [3]string{"application/json; charset=utf-8", "", "{}"}, ""},
		{"parameter value", [3]string{"text/plain; a=x", "", "x"}, [3]string{"text/plain; a=X", "", "x"}, ""},
		{"parameter", [3]string{"text/plain", "", "x"}, [3]string{"text/plain; a=x", "", "x"}, ""},
		{"a parameter holding another", [3]string{`text/plain; a="1;b=2"`, "", "x"}, [3]string{"text/plain; a=1; b=2", "", "x"}, ""},
		{"RFC 2231 parameter", [3]string{"text/plain; charset*=utf-8''utf-8", "", "x"}, [3]string{"text/plain; charset=utf-8", "", "x"}, ""},
		{"two Content-Type values", [3]string{"text/plain, application/json", "", "{}"}, [3]string{"text/plain", "", "{}"}, ""},
		{"Content-Type that does not parse", [3]string{"text/plain;;a", "", "x"}, [3]string{"text/plain;;b", "", "x"}, ""},
		{"content coding", [3]string{"text/plain", "gzip", "x"}, [3]string{"text/plain", "", "x"}, ""},
		{"content codings' order", [3]string{"text/plain", "gzip, br", "x"}, [3]string{"text/plain", "br, gzip", "x"}, ""},
		{"identity coding", [3]string{"text/plain", "identity", "x"}, [3]string{"text/plain", "", "x"}, ""},
		// Under a content coding the bytes are not JSON text: no canonical form.
		{"JSON under a coding", [3]string{"application/json", "br", `{"a":1}`}, [3]string{"application/json", "br", `{ "a":1}`}, ""},
		// Under another charset, the bytes of é in UTF-8 are two other
		// characters, and \u00e9 is é.
		{"JSON in ISO-8859-1", [3]string{"application/json; charset=iso-8859-1", "", `"é"`}, [3]string{"application/json; charset=iso-8859-1", "", `"\u00e9"`}, ""},
	}
	for _, d := range differ {
		if fpOf(t, d.a[0], d.a[1], d.a[2]) == fpOf(t, d.b[0], d.b[1], d.b[2]) {
			t.Errorf("%s: %q and %q share a fingerprint", d.why, d.a, d.b)
		}
	}
}

// TestFingerprintForm: a form counts byte for byte, since form parsers
// disagree on what else would be the same.
func TestFingerprintForm(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	if a, b := fpOf(t, form, "", "amount=5&currency=usd"), fpOf(t, form, "", "amount=5&currency=usd"); a != b {
		t.Fatal("the same form has two fingerprints")
	}
	for _, p := range [][2]string{
		{"amount=5", "amount=6"},
		{"a=b+c", "a=b%20c"},                       // decodeURIComponent reads '+' as '+'
		{"a=b+c", "a=b%2Bc"},                       // form parsers read '+' as a space
		{"a=1;b=2", "a=1&b=2"},                     // some parsers split on ';', Go refuses it
		{"amount=1&amount=2", "amount=2&amount=1"}, // PHP keeps the last, Go's FormValue the first
		{"items[][a]=1&items[][b]=2&items[][a]=3", "items[][a]=1&items[][a]=3&items[][b]=2"}, // Rack's nested parameters
	} {
		if fpOf(t, form, "", p[0]) == fpOf(t, form, "", p[1]) {
			t.Errorf("forms %q and %q share a fingerprint", p[0], p[1])
		}
	}
}

func TestFingerprintQuery(t *testing.T) {
	t.Parallel()
	fp := func(q string) string {
		t.Helper()
		return mustFingerprint(t, idem.FingerprintInput{Method: "POST", Operation: "POST /p", Query: q}, idem.FingerprintOptions{})
	}
	for _, p := range [][2]string{
		{"a=%41", "a=A"},
		{"%61=1", "a=1"},
		{"a=%7e%2D%2e%5F", "a=~-._"},
		{"a=%2f", "a=%2F"},
		{"a=%c3%a9", "a=%C3%A9"},
	} {
		if fp(p[0]) != fp(p[1]) {
			t.Errorf("queries %q and %q have different fingerprints", p[0], p[1])
		}
	}
	for _, p := range [][2]string{
		{"a=1&b=2", "b=2&a=1"},
		{"a=1&a=2", "a=2&a=1"},
		{"a=b+c", "a=b%20c"},
		{"a=%2B", "a=+"},
		{"a=%26b", "a&b"},
		{"a=%3D", "a=="},
		{"a=1;b=2", "a=1&b=2"},
		{"items[][a]=1&items[][b]=2&items[][a]=3", "items[][a]=1&items[][a]=3&items[][b]=2"},
		{"a=%", "a=%25"},
		{"a=%zz", "a=%ZZ"},
		{"a=%4", "a=%34"},
		{"", "a"},
	} {
		if fp(p[0]) == fp(p[1]) {
			t.Errorf("queries %q and %q share a fingerprint", p[0], p[1])
		}
	}
}

// multipartForm writes parts (name, filename or "", content) as a
// multipart/form-data body with boundary, as curl -F does.
func multipartForm(t testing.TB, boundary string, parts ...[3]string) (contentType, body string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		var pw io.Writer
		var err error
		if p[1] != "" {
			pw, err = w.CreateFormFile(p[0], p[1])
		} else {
			pw, err = w.CreateFormField(p[0])
		}
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(pw, p[2])
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w.FormDataContentType(), buf.String()
}

func TestFingerprintMultipart(t *testing.T) {
	t.Parallel()
	parts := [][3]string{{"amount", "", "100"}, {"file", "a.txt", "line 1\r\n--not a delimiter\r\n"}}
	ctA, bodyA := multipartForm(t, "------------------------d74496d66958873e", parts...)
	ctB, bodyB := multipartForm(t, "------------------------5c4b6e7d8a9f0e1d", parts...)
	want := fpOf(t, ctA, "", bodyA)
	if fpOf(t, ctB, "", bodyB) != want {
		t.Error("the same parts under a new boundary (curl -F's retry) have another fingerprint")
	}
	if fpOf(t, `multipart/form-data; boundary="------------------------d74496d66958873e"`, "", bodyA) != want {
		t.Error("a quoted boundary changed the fingerprint")
	}
	for name, other := range map[string][][3]string{
		"a part's content":  {{"amount", "", "999"}, parts[1]},
		"a part's name":     {{"Amount", "", "100"}, parts[1]},
		"a file name":       {parts[0], {"file", "b.txt", parts[1][2]}},
		"the parts' order":  {parts[1], parts[0]},
		"one part less":     {parts[0]},
		"a file, not field": {{"amount", "amount", "100"}, parts[1]},
	} {
		ct, body := multipartForm(t, "------------------------5c4b6e7d8a9f0e1d", other...)
		if fpOf(t, ct, "", body) == want {
			t.Errorf("%s changed, the fingerprint did not", name)
		}
	}
	if fpOf(t, strings.Replace(ctB, "form-data", "mixed", 1), "", bodyB) == want {
		t.Error("multipart/mixed and multipart/form-data share a fingerprint")
	}
	if fpOf(t, ctB+"; charset=utf-8", "", bodyB) == want {
		t.Error("a charset parameter did not count")
	}
	if fpOf(t, ctB, "gzip", bodyB) == fpOf(t, ctA, "gzip", bodyA) {
		t.Error("under a content coding the boundary did not count")
	}
}

// TestFingerprintMultipartTwoBoundaries: the same bytes carry one form for
// the boundary AAA and another for BBB; the two requests differ.
func TestFingerprintMultipartTwoBoundaries(t *testing.T) {
	t.Parallel()
	_, forB := multipartForm(t, "BBB", [3]string{"amount", "", "999"})
	_, forA := multipartForm(t, "AAA", [3]string{"amount", "", "100"})
	body := forB + forA // for AAA, the BBB form is the preamble; for BBB, the AAA form is the epilogue
	ctA, ctB := "multipart/form-data; boundary=AAA", "multipart/form-data; boundary=BBB"
	if a, b := readMultipart(t, ctA, body), readMultipart(t, ctB, body); reflect.DeepEqual(a, b) {
		t.Fatalf("the test body reads alike under both boundaries: %q", a)
	}
	if fpOf(t, ctA, "", body) == fpOf(t, ctB, "", body) {
		t.Error("one body under two boundaries shares a fingerprint")
	}
}

// TestFingerprintMultipartAsSent: a body for which the boundary cannot be
// left out counts byte for byte under its whole Content-Type.
func TestFingerprintMultipartAsSent(t *testing.T) {
	t.Parallel()
	cases := []struct {
		why                  string
		b1, b2, body1, body2 string
	}{
		{"the boundary inside a part", "abc", "xyz",
			"--abc\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nxabcx\r\n--abc--\r\n",
			"--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nxxyzx\r\n--xyz--\r\n"},
		{"a boundary that is the start of a longer line", "AA", "XY",
			"--AAA\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--AAA--\r\n",
			"--XYA\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--XYA--\r\n"},
		{"a boundary of 71 characters", strings.Repeat("a", 71), strings.Repeat("b", 71),
			"--" + strings.Repeat("a", 71) + "\r\n\r\n1\r\n--" + strings.Repeat("a", 71) + "--",
			"--" + strings.Repeat("b", 71) + "\r\n\r\n1\r\n--" + strings.Repeat("b", 71) + "--"},
		{"a boundary ending in a space", "ab ", "cd ",
			"--ab \r\n\r\n1\r\n--ab --", "--cd \r\n\r\n1\r\n--cd --"},
		// A parser that trims the parameter looks for "--ab", which is not
		// in the first body; the second parses.
		{"a boundary starting with a space", " ab", "xyz",
			"-- ab\r\n\r\n1\r\n-- ab--", "--xyz\r\n\r\n1\r\n--xyz--"},
		{"a boundary with a character RFC 2046 does not allow", "a;b", "c;d",
			"--a;b\r\n\r\n1\r\n--a;b--", "--c;d\r\n\r\n1\r\n--c;d--"},
		// After a first delimiter line ending in CRLF, Go's reader takes
		// "\n--AAA" as content, boundary and all.
		{"a boundary after a bare line feed", "AAA", "0",
			"--AAA\r\n\n\n--AAA", "--0\r\n\n\n--0"},
	}
	for _, tc := range cases {
		ct1, ct2 := `multipart/form-data; boundary="`+tc.b1+`"`, `multipart/form-data; boundary="`+tc.b2+`"`
		if fpOf(t, ct1, "", tc.body1) == fpOf(t, ct2, "", tc.body2) {
			t.Errorf("%s: the boundary did not count", tc.why)
		}
		if a, b := fpOf(t, ct1, "", tc.body1), fpOf(t, ct1, "", tc.body1); a != b {
			t.Errorf("%s: the same request has two fingerprints", tc.why)
		}
	}
	// Malformed bodies and Content-Types fingerprint without a panic.
	for _, ct := range []string{"multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=a; boundary=b", "multipart/"} {
		for _, body := range []string{"", "--", "--a", "--a\r\n", "\r\n--a--", "--a\r\nbad header\r\n\r\n--a--"} {
			fpOf(t, ct, "", body)
			fpOf(t, "multipart/form-data; boundary=a", "", body)
		}
	}
}

// readMultipart returns the parts of a multipart body as Go reads them:
// each part's header and content, raw and decoded, and whether the reading
// ended at the end or on an error (whose text, which may quote a delimiter
// line, does not count).
func readMultipart(t testing.TB, ct, body string) []string {
	t.Helper()
	var out []string
	for _, raw := range []bool{true, false} {
		_, params, err := mime.ParseMediaType(ct)
		if err != nil {
			return append(out, "content type: "+err.Error())
		}
		r := multipart.NewReader(strings.NewReader(body), params["boundary"])
		for {
			next := r.NextPart
			if raw {
				next = r.NextRawPart
			}
			p, err := next()
			if err != nil {
				out = append(out, "end: "+fmt.Sprint(err == io.EOF))
				break
			}
			content, err := io.ReadAll(p)
			out = append(out, fmt.Sprint(p.Header), string(content)) // fmt sorts the names
			if err != nil {
				out = append(out, "content: error")
				break
			}
		}
	}
	return out
}

// TestTwoContentTypeHeadersAreNotOne: a request with two Content-Type
// headers and one whose single Content-Type joins the same values with a
// comma are read differently (a server that takes the first header gets
// "text/plain" from the one and the whole list from the other), so the
// same key with the other gets 422, not the first one's answer.
func TestTwoContentTypeHeadersAreNotOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	send := func(ct ...string) *httptest.ResponseRecorder {
		r := f.request(call{key: "k", body: "amount=5"})
		r.Header["Content-Type"] = ct
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w
	}
	if w := send("text/plain", "application/x-www-form-urlencoded"); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	if w := send("text/plain, application/x-www-form-urlencoded"); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("one header of both values: %d %s, want 422", w.Code, w.Body)
	}
	if w := send("text/plain", "application/x-www-form-urlencoded"); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the same two headers again: %d, not a replay", w.Code)
	}
	if n := f.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
}

// TestEmptyContentTypeHeaderCounts: a request with an empty Content-Type
// header besides its type is read differently from one with the type
// alone (a server that takes the first header, as Go's and Node's do,
// finds no type before a form; one that takes the last, none after it),
// so the same key with the other gets 422, not the first one's answer.
// mime.ParseMediaType trims the line feed that joins the headers, and
// both read as the type alone.
func TestEmptyContentTypeHeaderCounts(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	for i, first := range [][]string{{"", form}, {form, ""}, {form, " "}} {
		f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
		send := func(ct ...string) *httptest.ResponseRecorder {
			r := f.request(call{key: "k", body: "amount=5"})
			r.Header["Content-Type"] = ct
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, r)
			return w
		}
		if w := send(first...); w.Code != http.StatusCreated {
			t.Fatalf("%d: first %q: %d %s", i, first, w.Code, w.Body)
		}
		if w := send(form); w.Code != http.StatusUnprocessableEntity {
			t.Fatalf("%d: after %q, the type alone: %d %s, want 422", i, first, w.Code, w.Body)
		}
		if n := f.runs.Load(); n != 1 {
			t.Fatalf("%d: the handler ran %d times", i, n)
		}
	}
}
