package idemstore_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

func TestRequestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	for _, r := range []*idemstore.Request{
		{Method: "POST", Path: "/payments"},
		{Method: "PATCH", Path: "/orders/7", Query: "a=1&b=%00", Body: []byte{0, 1, 2, 0xff}},
		{},
	} {
		got, err := idemstore.DecodeRequest(idemstore.EncodeRequest(r))
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip: got %+v, want %+v", got, r)
		}
	}
	if got, err := idemstore.DecodeRequest(idemstore.EncodeRequest(nil)); got != nil || err != nil {
		t.Fatalf("nil round trip: %v, %v", got, err)
	}
}

func TestDecodeRequestRejectsCorruptInput(t *testing.T) {
	t.Parallel()
	good := idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/p", Body: []byte("body")})
	for name, b := range map[string][]byte{
		"unknown version": append([]byte{9}, good[1:]...),
		"truncated":       good[:len(good)-1],
		"trailing":        append(append([]byte{}, good...), 0),
		"huge length":     {1, 0xff, 0xff, 0xff, 0xff, 0x0f},
	} {
		if _, err := idemstore.DecodeRequest(b); !errors.Is(err, idemstore.ErrCorruptRequest) {
			t.Errorf("%s: err = %v, want ErrCorruptRequest", name, err)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add(idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/p", Query: "q", Body: []byte("b")}))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := idemstore.DecodeRequest(b)
		if err != nil {
			return
		}
		again, err := idemstore.DecodeRequest(idemstore.EncodeRequest(r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoding %+v: %+v, %v", r, again, err)
		}
	})
}
