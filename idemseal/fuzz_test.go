package idemseal_test

import (
	"bytes"
	"errors"
	"net/http"
	"testing"

	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemstore"
)

// FuzzOpen feeds the sealed-record decoder hostile bytes, as a store an
// attacker can write to would: it must fail with ErrSealed and never
// panic, and nothing but a blob the ring sealed for that very record
// opens. (Each fuzzing process seals its own seeds, with its own nonces, so
// a blob that opens is checked by what it opens to, not by its bytes.)
func FuzzOpen(f *testing.F) {
	k := ring(f, key1, key2)
	sresp, _ := k.SealResponse(recKey, answer)
	sreq, _ := k.SealRequest(recKey, request)
	other, _ := ring(f, idemseal.Key{ID: "other", Secret: secret(3)}).SealResponse(recKey, answer)
	for _, seed := range [][]byte{sresp.Body, sreq.Body, other.Body, nil, {1}, {1, 0}, {1, 3, 'o', 'n', 'e'}, {2, 3, 'o', 'n', 'e'}, {1, 255}} {
		f.Add(seed, 201, "k-1", "POST")
	}
	f.Fuzz(func(t *testing.T, blob []byte, status int, key, method string) {
		rk := idemstore.Key{Scope: recKey.Scope, Operation: recKey.Operation, Key: key}
		resp, err := k.OpenResponse(rk, &idemstore.Response{Status: status, Header: http.Header{idemstore.SealedHeader: {"1"}}, Body: blob})
		switch {
		case err != nil && !errors.Is(err, idemstore.ErrSealed):
			t.Fatalf("OpenResponse error %v does not wrap ErrSealed", err)
		case err == nil && !(status == 201 && key == recKey.Key):
			t.Fatalf("OpenResponse opened a blob it did not seal for this record: %+v", resp)
		case err == nil && !sameResponse(resp, answer):
			t.Fatalf("OpenResponse = %+v, want %+v", resp, answer)
		}
		req, err := k.OpenRequest(rk, &idemstore.Request{Method: method, Path: request.Path, Query: idemstore.SealedQuery, Body: blob})
		switch {
		case err != nil && !errors.Is(err, idemstore.ErrSealed):
			t.Fatalf("OpenRequest error %v does not wrap ErrSealed", err)
		case err == nil && !(method == "POST" && key == recKey.Key):
			t.Fatalf("OpenRequest opened a blob it did not seal for this record: %+v", req)
		case err == nil && (req.Query != request.Query || !bytes.Equal(req.Body, request.Body)):
			t.Fatalf("OpenRequest = %+v, want %+v", req, request)
		}
	})
}

// FuzzSealRoundTrip seals arbitrary answers and requests: each opens to
// exactly what was sealed.
func FuzzSealRoundTrip(f *testing.F) {
	k := ring(f, key1)
	f.Add(201, "Content-Type", "application/json", []byte(`{"id":1}`), "a=1", "k")
	f.Add(0, "", "", []byte(nil), "", "")
	f.Add(-1, "X", "\x00\xff", []byte{0, 1, 2}, "\x01idem-sealed", "\xff")
	f.Fuzz(func(t *testing.T, status int, name, value string, body []byte, query, key string) {
		rk := idemstore.Key{Scope: "s", Operation: "op", Key: key}
		in := &idemstore.Response{Status: status, Body: body}
		if name != "" {
			in.Header = http.Header{name: {value}}
		}
		sealed, err := k.SealResponse(rk, in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := k.OpenResponse(rk, sealed)
		if err != nil || out.Status != status || !bytes.Equal(out.Body, body) || (name != "" && (len(out.Header[name]) != 1 || out.Header[name][0] != value)) {
			t.Fatalf("answer %+v came back as %+v, %v", in, out, err)
		}
		sreq, err := k.SealRequest(rk, &idemstore.Request{Method: "POST", Path: "/p", Query: query, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		req, err := k.OpenRequest(rk, sreq)
		if err != nil || req.Method != "POST" || req.Path != "/p" || req.Query != query || !bytes.Equal(req.Body, body) {
			t.Fatalf("request came back as %+v, %v", req, err)
		}
	})
}
