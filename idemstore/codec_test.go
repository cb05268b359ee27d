package idemstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

func TestResponseCodecRoundTrip(t *testing.T) {
	t.Parallel()
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	cases := []struct {
		name string
		r    *idemstore.Response
	}{
		{"empty", &idemstore.Response{Status: 204}},
		{"json", &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}},
		{"binary body", &idemstore.Response{Status: 200, Body: binary}},
		{"many headers", &idemstore.Response{Status: 500, Header: http.Header{"A": {"1", "2"}, "B": {""}, "X-Long": {string(bytes.Repeat([]byte("v"), 70000))}}}},
		{"not replayable", &idemstore.Response{Status: 200, NotReplayable: "body_too_large"}},
		{"200 headers", &idemstore.Response{Status: 99999, Header: manyHeaders(200)}},
		{"body of 127", &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("b"), 127)}},
		{"body of 128", &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("b"), 128)}},
		{"body of 16383", &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("b"), 16383)}},
		{"body of 16384", &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("b"), 16384)}},
		{"body of 2 MiB", &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("b"), 2<<20)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			enc := idemstore.EncodeResponse(tc.r)
			if cap(enc) != len(enc) {
				// A store that keeps the bytes keeps their capacity too.
				t.Errorf("encoded in %d bytes with a capacity of %d", len(enc), cap(enc))
			}
			got, err := idemstore.DecodeResponse(enc)
			if err != nil {
				t.Fatal(err)
			}
			want := *tc.r
			if want.Body == nil {
				want.Body = []byte{}
			}
			if !reflect.DeepEqual(got, &want) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, &want)
			}
		})
	}
}

func manyHeaders(n int) http.Header {
	h := http.Header{}
	for i := range n {
		h.Set(fmt.Sprint("X-H", i), fmt.Sprint(i))
	}
	return h
}

func TestResponseCodecNil(t *testing.T) {
	t.Parallel()
	if b := idemstore.EncodeResponse(nil); b != nil {
		t.Fatalf("EncodeResponse(nil) = %v", b)
	}
	r, err := idemstore.DecodeResponse(nil)
	if r != nil || err != nil {
		t.Fatalf("DecodeResponse(nil) = %v, %v", r, err)
	}
}

func TestResponseCodecRejectsCorruptInput(t *testing.T) {
	t.Parallel()
	good := idemstore.EncodeResponse(&idemstore.Response{Status: 200, Header: http.Header{"A": {"b"}}, Body: []byte("hello")})
	bad := [][]byte{
		{9, 1, 2},                             // unknown version
		good[:len(good)-2],                    // truncated body
		append(good[:len(good):len(good)], 0), // trailing byte
		{1, 0xff},                             // bad varint
		{1, 200, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, // absurd header count
	}
	for i, b := range bad {
		if _, err := idemstore.DecodeResponse(b); !errors.Is(err, idemstore.ErrCorruptResponse) {
			t.Errorf("case %d: err = %v, want ErrCorruptResponse", i, err)
		}
	}
}

func TestStateValid(t *testing.T) {
	t.Parallel()
	for _, s := range []idemstore.State{idemstore.StatePending, idemstore.StateCompleted, idemstore.StateNeedsReview} {
		if !s.Valid() {
			t.Errorf("%q not valid", s)
		}
	}
	if idemstore.State("done").Valid() {
		t.Error(`"done" valid`)
	}
}

func TestKeyCursor(t *testing.T) {
	t.Parallel()
	for _, k := range []idemstore.Key{{}, {Scope: "a|b", Operation: "c", Key: "d"}, {Scope: "a", Operation: "b|c", Key: "\x00é"}} {
		got, err := idemstore.DecodeKeyCursor(idemstore.EncodeKeyCursor(k))
		if err != nil || got != k {
			t.Fatalf("round trip %+v: %+v, %v", k, got, err)
		}
	}
	if idemstore.EncodeKeyCursor(idemstore.Key{Scope: "a|b", Operation: "c"}) == idemstore.EncodeKeyCursor(idemstore.Key{Scope: "a", Operation: "b|c"}) {
		t.Fatal("cursors collide")
	}
	for _, c := range []string{"!!!", "AQ", idemstore.EncodeKeyCursor(idemstore.Key{Key: "x"}) + "AA"} {
		if _, err := idemstore.DecodeKeyCursor(c); !errors.Is(err, idemstore.ErrBadCursor) {
			t.Errorf("DecodeKeyCursor(%q) err = %v", c, err)
		}
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(idemstore.EncodeResponse(&idemstore.Response{Status: 201, Header: http.Header{"A": {"1", "2"}, "B": {""}}, Body: []byte("x")}))
	f.Add(idemstore.EncodeResponse(&idemstore.Response{Status: 200, NotReplayable: "streamed"}))
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := idemstore.DecodeResponse(b)
		if err != nil || r == nil {
			return
		}
		// Whatever decodes, encodes and decodes back the same.
		again, err := idemstore.DecodeResponse(idemstore.EncodeResponse(r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip of %x: %+v -> %+v, %v", b, r, again, err)
		}
	})
}

// TestDecodeReadResponse: what a store's ReadResponse read decodes as the
// answer, with an empty body as an empty slice; a record completed without
// an answer is not found, and corrupt bytes are an error.
func TestDecodeReadResponse(t *testing.T) {
	t.Parallel()
	b := idemstore.EncodeResponse(&idemstore.Response{Status: 204, Header: http.Header{"X-A": {"1"}}})
	resp, err := idemstore.DecodeReadResponse(b)
	if err != nil || resp.Status != 204 || resp.Header.Get("X-A") != "1" || resp.Body == nil || len(resp.Body) != 0 {
		t.Errorf("DecodeReadResponse = %+v, %v; want 204 with X-A and an empty, non-nil body", resp, err)
	}
	if resp, err := idemstore.DecodeReadResponse(nil); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("no answer: %+v, %v; want ErrNotFound", resp, err)
	}
	if _, err := idemstore.DecodeReadResponse([]byte{0xff, 1}); !errors.Is(err, idemstore.ErrCorruptResponse) {
		t.Errorf("corrupt bytes: %v; want ErrCorruptResponse", err)
	}
}
