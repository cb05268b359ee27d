package idemstore_test

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// TestEncodeResponseExactSizeAtEdges: EncodeResponse sizes its buffer
// exactly (capacity equals length, with no growth on the way) at the
// edges of its varints and of its inputs: an empty answer, a negative
// status (ten varint bytes), a name or value whose length takes one, two
// or three varint bytes, 127 and 128 values under one name, and a header
// with no values; each decodes back to what was encoded.
func TestEncodeResponseExactSizeAtEdges(t *testing.T) {
	t.Parallel()
	many := func(n int) []string {
		vs := make([]string, n)
		for i := range vs {
			vs[i] = strings.Repeat("v", i%3)
		}
		return vs
	}
	for name, r := range map[string]*idemstore.Response{
		"empty":            {},
		"empty body":       {Status: 204, Body: []byte{}},
		"negative status":  {Status: -1, Body: []byte("x")},
		"huge status":      {Status: 1 << 40},
		"not replayable":   {Status: 200, NotReplayable: strings.Repeat("r", 128)},
		"127-byte value":   {Status: 200, Header: http.Header{"A": {strings.Repeat("x", 127)}}},
		"128-byte value":   {Status: 200, Header: http.Header{"A": {strings.Repeat("x", 128)}}},
		"16384-byte name":  {Status: 200, Header: http.Header{strings.Repeat("N", 1<<14): {"v"}}},
		"1 MiB value":      {Status: 200, Header: http.Header{"Big": {strings.Repeat("x", 1<<20)}}},
		"127 values":       {Status: 200, Header: http.Header{"Many": many(127)}},
		"128 values":       {Status: 200, Header: http.Header{"Many": many(128), "Other": {""}}},
		"no values":        {Status: 200, Header: http.Header{"Empty": {}, "Full": {"1"}}},
		"128-byte body":    {Status: 200, Body: []byte(strings.Repeat("b", 128))},
		"16384-byte body":  {Status: 200, Body: []byte(strings.Repeat("b", 1<<14))},
		"every part large": {Status: 599, Header: http.Header{strings.Repeat("K", 200): many(300)}, Body: []byte(strings.Repeat("b", 1<<16)), NotReplayable: ""},
	} {
		b := idemstore.EncodeResponse(r)
		if cap(b) != len(b) {
			t.Errorf("%s: %d bytes in a buffer of %d", name, len(b), cap(b))
		}
		got, err := idemstore.DecodeResponse(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := *r
		if len(want.Header) == 0 {
			want.Header = nil
		}
		if want.Body == nil {
			want.Body = []byte{}
		}
		for k, vs := range want.Header {
			if len(vs) == 0 {
				want.Header[k] = []string{}
			}
		}
		if !reflect.DeepEqual(got, &want) {
			t.Errorf("%s: decoded %+.200v, want %+.200v", name, got, &want)
		}
	}
}
