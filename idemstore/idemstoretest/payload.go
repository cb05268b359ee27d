package idemstoretest

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

func testPayload(t *testing.T, h Harness) {
	s := h.New(t)

	big := make([]byte, 4<<20)
	rng := rand.NewChaCha8([32]byte{'i', 'd', 'e', 'm'})
	_, _ = rng.Read(big)
	every := make([]byte, 0, 512)
	for i := range 256 {
		every = append(every, byte(i))
	}
	for i := 255; i >= 0; i-- {
		every = append(every, byte(i))
	}
	many := http.Header{}
	for i := range 100 {
		many.Set(fmt.Sprintf("X-Header-%03d", i), fmt.Sprintf("value %d; with=\"quotes\", commas", i))
	}

	cases := []struct {
		name string
		resp *idemstore.Response
		want *idemstore.Response // nil means resp
	}{
		{"Body4MiB", &idemstore.Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: big}, nil},
		{"EveryByteValue", &idemstore.Response{Status: 200, Body: every}, nil},
		{"HundredHeaders", &idemstore.Response{Status: 201, Header: many, Body: []byte("ok")}, nil},
		{"MultiValuedHeaders", &idemstore.Response{Status: 202, Header: http.Header{
			"Link":           {`<https://example.com/a>; rel="next"`, `<https://example.com/b>; rel="prev"`},
			"Vary":           {"Accept", "Accept-Encoding", "Accept"},
			"X-Empty":        {""},
			"Content-Type":   {"text/plain; charset=utf-8"},
			"X-Unicode-Wert": {"grüße, 世界 ✓"},
		}, Body: []byte("multi")}, nil},
		{"EmptyBody", &idemstore.Response{Status: 204, Body: []byte{}}, nil},
		{"NilBody", &idemstore.Response{Status: 204}, &idemstore.Response{Status: 204, Body: []byte{}}},
		{"NotReplayable", &idemstore.Response{Status: 200, Header: http.Header{"Content-Type": {"video/mp4"}}, NotReplayable: "body_too_large"}, nil},
		{"ServerError", &idemstore.Response{Status: 500, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"boom"}`)}, nil},
		{"TextWithNULAndNewlines", &idemstore.Response{Status: 200, Body: []byte("a\x00b\r\nc\n\x00")}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, s)
			rec := f.reserve(f.key(tc.name), leaseLive)
			want := tc.want
			if want == nil {
				want = tc.resp
			}
			f.complete(rec, want, retainLive)
			rec = f.reserve(f.key(tc.name+"-as-given"), leaseLive)
			f.complete(rec, tc.resp, retainLive)
			want = tc.want
			if want == nil {
				want = tc.resp
			}
			got := f.get(rec.Key)
			if d := diffResponse(got.Response, want); d != "" {
				t.Fatalf("Get: response does not round-trip: %s", d)
			}
			if len(got.Response.Body) != len(want.Body) {
				t.Fatalf("Get: body of %d bytes, want %d", len(got.Response.Body), len(want.Body))
			}
			again, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: rec.Key, Fingerprint: rec.Fingerprint, Token: newToken(), Lease: leaseLive})
			if err != nil || created {
				t.Fatalf("Reserve of the completed key: created = %v, err = %v", created, err)
			}
			if d := diffResponse(again.Response, want); d != "" {
				t.Fatalf("Reserve: response does not round-trip: %s", d)
			}
		})
	}
}

// testResponseNotKept checks that a store copies or encodes the response it
// completes with: callers reuse their buffers and header maps afterwards.
func testResponseNotKept(t *testing.T, h Harness) {
	f := newFixture(t, h.New(t))
	resp := &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
	rec := f.reserve(f.key("reused"), leaseLive)
	if err := f.s.Complete(f.ctx(), idemstore.CompleteParams{Key: rec.Key, Token: rec.Token, Response: resp, Retention: retainLive}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	// The caller reuses everything.
	resp.Status = 500
	resp.Body[2] = 'X'
	resp.Header["Content-Type"][0] = "text/plain"
	resp.Header.Set("X-Later", "1")
	want := &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
	if d := diffResponse(f.get(rec.Key).Response, want); d != "" {
		t.Fatalf("the store kept the caller's response instead of a copy: %s", d)
	}
}

// visibleASCII returns n bytes of visible ASCII (0x21..0x7e), cycling so
// every such character appears.
func visibleASCII(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteByte(byte(0x21 + i%94))
	}
	return b.String()
}

func testKeys(t *testing.T, h Harness) {
	s := h.New(t)

	t.Run("Unusual", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		keys := []idemstore.Key{
			{Scope: f.scope, Operation: "POST /payments", Key: visibleASCII(255)},
			{Scope: f.scope, Operation: "POST /payments", Key: strings.Repeat("~", 255)},
			{Scope: f.scope + " with spaces", Operation: "POST /a b", Key: "k"},
			{Scope: f.scope + `|:{}"'` + "`", Operation: `op|:{}"'`, Key: `k|:{}"'`},
			{Scope: f.scope + `%_*?[]\`, Operation: `%_*?[^a]\`, Key: `%_*?[]\`},
			{Scope: f.scope + "-ünïcödé-用户-🔑", Operation: "créer un paiement ✓", Key: "k"},
			{Scope: f.scope + "\t\n", Operation: "op\r\n", Key: "k"},
		}
		for i, k := range keys {
			rec, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{
				Key: k, Fingerprint: fmt.Sprintf("fp-%d", i), Token: newToken(), Lease: leaseLive,
			})
			if err != nil || !created || rec != nil {
				t.Fatalf("Reserve(%q): created = %v, record %v, err = %v", k, created, rec, err)
			}
			rec = f.get(k)
			if rec.Key != k {
				t.Fatalf("Reserve(%q) returned key %q", k, rec.Key)
			}
			f.requireUnchanged(rec, "Reserve")
			done := f.complete(rec, jsonResponse(fmt.Sprintf(`{"i":%d}`, i)), retainLive)
			f.requireUnchanged(done, "Complete")
		}
	})

	t.Run("LookAlikesStayApart", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		sc := f.scope
		groups := [][]idemstore.Key{
			{{Scope: sc + "a|b", Operation: "c", Key: "k"}, {Scope: sc + "a", Operation: "b|c", Key: "k"}},
			{{Scope: sc + "a:b", Operation: "c", Key: "k"}, {Scope: sc + "a", Operation: "b:c", Key: "k"}},
			{{Scope: sc, Operation: "a:b", Key: "c"}, {Scope: sc, Operation: "a", Key: "b:c"}},
			{{Scope: sc, Operation: "a|b", Key: "c"}, {Scope: sc, Operation: "a", Key: "b|c"}},
			{{Scope: sc + "{a}", Operation: "b", Key: "c"}, {Scope: sc + "{a", Operation: "}b", Key: "c"}},
			{{Scope: sc + "a b", Operation: "c", Key: "d"}, {Scope: sc + "a", Operation: "b c", Key: "d"}},
			{{Scope: sc + "a/b", Operation: "c", Key: "d"}, {Scope: sc + "a", Operation: "b/c", Key: "d"}},
			{{Scope: sc + "a\x00b", Operation: "c", Key: "d"}, {Scope: sc + "a", Operation: "b\x00c", Key: "d"}},
			// Keys are compared byte for byte: no case folding, accent
			// folding or trailing-space padding (SQL collations do all three).
			{{Scope: sc, Operation: "op", Key: "abc"}, {Scope: sc, Operation: "op", Key: "ABC"}},
			{{Scope: sc + "x", Operation: "op", Key: "k"}, {Scope: sc + "X", Operation: "op", Key: "k"}},
			{{Scope: sc, Operation: "créer", Key: "k"}, {Scope: sc, Operation: "creer", Key: "k"}},
			{{Scope: sc + "a", Operation: "op", Key: "k"}, {Scope: sc + "a ", Operation: "op", Key: "k"}},
			{{Scope: sc, Operation: "op", Key: "k"}, {Scope: sc, Operation: "op ", Key: "k"}},
			{{Scope: sc + "ß", Operation: "op", Key: "k"}, {Scope: sc + "ss", Operation: "op", Key: "k"}},
		}
		for _, g := range groups {
			var recs []*idemstore.Record
			for i, k := range g {
				if strings.ContainsRune(k.Scope+k.Operation, 0) {
					// NUL cannot be stored in some backends' text columns;
					// a store may refuse such a key, but must not mix it up.
					_, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: k, Fingerprint: fmt.Sprintf("fp-%d", i), Token: newToken(), Lease: leaseLive})
					if err != nil {
						recs = nil
						break
					}
					if !created {
						t.Fatalf("Reserve(%q): created = false, so it collided with %q", k, g[0])
					}
					recs = append(recs, f.get(k))
					continue
				}
				rec, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: k, Fingerprint: fmt.Sprintf("fp-%d", i), Token: newToken(), Lease: leaseLive})
				if err != nil {
					t.Fatalf("Reserve(%q): %v", k, err)
				}
				if !created {
					t.Fatalf("Reserve(%q): created = false, so it collided with %q (got %+v)", k, g[0], rec.Key)
				}
				recs = append(recs, f.get(k))
			}
			for _, r := range recs {
				f.requireUnchanged(r, "reserving a look-alike key")
			}
		}
	})
}
