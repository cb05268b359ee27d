package idemseal_test

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemstore"
)

func secret(b byte) []byte { return bytes.Repeat([]byte{b}, idemseal.KeySize) }

func ring(t testing.TB, keys ...idemseal.Key) *idemseal.Keyring {
	t.Helper()
	k, err := idemseal.New(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var (
	key1    = idemseal.Key{ID: "one", Secret: secret(1)}
	key2    = idemseal.Key{ID: "two", Secret: secret(2)}
	recKey  = idemstore.Key{Scope: "user-1", Operation: "POST /payments", Key: "k-1"}
	answer  = &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}, Body: []byte(`{"id":"pay_secret"}`)}
	request = &idemstore.Request{Method: "POST", Path: "/payments", Query: "card=4242", Body: []byte(`{"amount":1000}`)}
)

func sameResponse(a, b *idemstore.Response) bool {
	return bytes.Equal(idemstore.EncodeResponse(a), idemstore.EncodeResponse(b))
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	k := ring(t, key1)
	sealed, err := k.SealResponse(recKey, answer)
	if err != nil {
		t.Fatal(err)
	}
	if !idemstore.IsSealedResponse(sealed) || sealed.Status != 201 {
		t.Fatalf("sealed response %+v: want the marker and the status in clear", sealed)
	}
	enc := idemstore.EncodeResponse(sealed)
	for _, clear := range []string{"pay_secret", "application/json", "X-Multi"} {
		if bytes.Contains(enc, []byte(clear)) {
			t.Fatalf("the stored form of a sealed answer holds %q in clear", clear)
		}
	}
	opened, err := k.OpenResponse(recKey, sealed)
	if err != nil || !sameResponse(opened, answer) {
		t.Fatalf("OpenResponse = %+v, %v; want %+v", opened, err, answer)
	}
	// Random nonces: the same answer seals differently each time, and each
	// opens.
	again, _ := k.SealResponse(recKey, answer)
	if bytes.Equal(again.Body, sealed.Body) {
		t.Fatal("two seals of one answer are equal")
	}

	sreq, err := k.SealRequest(recKey, request)
	if err != nil {
		t.Fatal(err)
	}
	if sreq.Method != "POST" || sreq.Path != "/payments" || !idemstore.IsSealedRequest(sreq) ||
		bytes.Contains(idemstore.EncodeRequest(sreq), []byte("4242")) || bytes.Contains(sreq.Body, []byte("amount")) {
		t.Fatalf("sealed request %+v: want method and path in clear, query and body sealed", sreq)
	}
	oreq, err := k.OpenRequest(recKey, sreq)
	if err != nil || oreq.Method != "POST" || oreq.Path != "/payments" || oreq.Query != request.Query || !bytes.Equal(oreq.Body, request.Body) {
		t.Fatalf("OpenRequest = %+v, %v", oreq, err)
	}
}

// What has nothing to hide, or is not sealed, passes through unchanged.
func TestPassThrough(t *testing.T) {
	t.Parallel()
	k := ring(t, key1)
	nr := &idemstore.Response{Status: 200, NotReplayable: "streamed"}
	if got, err := k.SealResponse(recKey, nr); got != nr || err != nil {
		t.Fatalf("SealResponse of a response not kept: %+v, %v", got, err)
	}
	bare := &idemstore.Request{Method: "POST", Path: "/x"}
	if got, err := k.SealRequest(recKey, bare); got != bare || err != nil {
		t.Fatalf("SealRequest with no query or body: %+v, %v", got, err)
	}
	for _, r := range []*idemstore.Response{nil, answer, nr} {
		if got, err := k.OpenResponse(recKey, r); got != r || err != nil {
			t.Fatalf("OpenResponse of a plain response: %+v, %v", got, err)
		}
	}
	for _, r := range []*idemstore.Request{nil, request, bare} {
		if got, err := k.OpenRequest(recKey, r); got != r || err != nil {
			t.Fatalf("OpenRequest of a plain request: %+v, %v", got, err)
		}
	}
	// An empty answer is sealed too: its status is bound.
	empty := &idemstore.Response{Status: 204}
	sealed, _ := k.SealResponse(recKey, empty)
	if !idemstore.IsSealedResponse(sealed) {
		t.Fatal("an empty answer was not sealed")
	}
	if got, err := k.OpenResponse(recKey, sealed); err != nil || got.Status != 204 || len(got.Body) != 0 || len(got.Header) != 0 {
		t.Fatalf("empty answer opened as %+v, %v", got, err)
	}
}

// A new key seals; the old ones still open what they sealed; a ring
// without the sealing key does not open.
func TestRotation(t *testing.T) {
	t.Parallel()
	old := ring(t, key1)
	sealedOld, _ := old.SealResponse(recKey, answer)

	rotated := ring(t, key2, key1)
	if rotated.ID() != "two" || strings.Join(rotated.IDs(), ",") != "two,one" {
		t.Fatalf("ID %q, IDs %v", rotated.ID(), rotated.IDs())
	}
	if got, err := rotated.OpenResponse(recKey, sealedOld); err != nil || !sameResponse(got, answer) {
		t.Fatalf("a rotated ring opening an old answer: %+v, %v", got, err)
	}
	sealedNew, _ := rotated.SealResponse(recKey, answer)
	if _, err := old.OpenResponse(recKey, sealedNew); !errors.Is(err, idemstore.ErrSealed) || !strings.Contains(err.Error(), `key "two"`) {
		t.Fatalf("the old ring opening an answer sealed with the new key: %v; want ErrSealed naming the key", err)
	}
	retired := ring(t, key2)
	if _, err := retired.OpenResponse(recKey, sealedOld); !errors.Is(err, idemstore.ErrSealed) {
		t.Fatalf("a ring without the old key: %v", err)
	}
	// Same ID, another secret: does not open.
	impostor := ring(t, idemseal.Key{ID: "one", Secret: secret(9)})
	if _, err := impostor.OpenResponse(recKey, sealedOld); !errors.Is(err, idemstore.ErrSealed) {
		t.Fatalf("another secret under the same ID: %v", err)
	}
}

// A sealed part moved to another record, given another status, method or
// path, or altered in any byte, does not open.
func TestTamper(t *testing.T) {
	t.Parallel()
	k := ring(t, key1)
	sealed, _ := k.SealResponse(recKey, answer)
	sreq, _ := k.SealRequest(recKey, request)
	for name, other := range map[string]idemstore.Key{
		"scope":     {Scope: "user-2", Operation: recKey.Operation, Key: recKey.Key},
		"operation": {Scope: recKey.Scope, Operation: "POST /refunds", Key: recKey.Key},
		"key":       {Scope: recKey.Scope, Operation: recKey.Operation, Key: "k-2"},
		// Length prefixes keep the parts apart: moving a byte from one
		// part to the next is another key.
		"boundary": {Scope: "user-1P", Operation: "OST /payments", Key: recKey.Key},
	} {
		if _, err := k.OpenResponse(other, sealed); !errors.Is(err, idemstore.ErrSealed) {
			t.Errorf("answer moved to another %s: %v", name, err)
		}
		if _, err := k.OpenRequest(other, sreq); !errors.Is(err, idemstore.ErrSealed) {
			t.Errorf("request moved to another %s: %v", name, err)
		}
	}
	status := *sealed
	status.Status = 200
	if _, err := k.OpenResponse(recKey, &status); !errors.Is(err, idemstore.ErrSealed) {
		t.Errorf("answer given another status: %v", err)
	}
	for _, change := range []func(r *idemstore.Request){
		func(r *idemstore.Request) { r.Method = "PUT" },
		func(r *idemstore.Request) { r.Path = "/refunds" },
	} {
		r := *sreq
		change(&r)
		if _, err := k.OpenRequest(recKey, &r); !errors.Is(err, idemstore.ErrSealed) {
			t.Errorf("request with another method or path: %v", err)
		}
	}
	for i := range sealed.Body {
		r := *sealed
		r.Body = bytes.Clone(sealed.Body)
		r.Body[i] ^= 0x01
		if got, err := k.OpenResponse(recKey, &r); !errors.Is(err, idemstore.ErrSealed) {
			t.Fatalf("byte %d flipped: %+v, %v", i, got, err)
		}
	}
	for n := range len(sealed.Body) {
		r := *sealed
		r.Body = sealed.Body[:n]
		if _, err := k.OpenResponse(recKey, &r); !errors.Is(err, idemstore.ErrSealed) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	badFormat := &idemstore.Response{Status: 201, Header: http.Header{idemstore.SealedHeader: {"2"}}, Body: sealed.Body}
	if _, err := k.OpenResponse(recKey, badFormat); !errors.Is(err, idemstore.ErrSealed) {
		t.Errorf("unknown format: %v", err)
	}
	notKept := *sealed
	notKept.NotReplayable = "streamed"
	if _, err := k.OpenResponse(recKey, &notKept); !errors.Is(err, idemstore.ErrSealed) {
		t.Errorf("sealed answer marked not kept: %v", err)
	}
	// A sealed request's blob where an answer's is expected: bound to
	// another purpose.
	swapped := &idemstore.Response{Status: 201, Header: sealed.Header, Body: sreq.Body}
	if _, err := k.OpenResponse(recKey, swapped); !errors.Is(err, idemstore.ErrSealed) {
		t.Errorf("a request's blob opened as an answer: %v", err)
	}
}

// OpenRecord opens a record's parts, and without a Sealer refuses sealed
// ones rather than hand them out as they are.
func TestOpenRecord(t *testing.T) {
	t.Parallel()
	k := ring(t, key1)
	sresp, _ := k.SealResponse(recKey, answer)
	sreq, _ := k.SealRequest(recKey, request)
	rec := &idemstore.Record{Key: recKey, Response: sresp, Request: sreq}
	if err := idemstore.OpenRecord(nil, &idemstore.Record{Key: recKey, Response: sresp}); !errors.Is(err, idemstore.ErrSealed) {
		t.Fatalf("OpenRecord with no sealer, sealed answer: %v", err)
	}
	if err := idemstore.OpenRecord(nil, &idemstore.Record{Key: recKey, Request: sreq}); !errors.Is(err, idemstore.ErrSealed) {
		t.Fatalf("OpenRecord with no sealer, sealed request: %v", err)
	}
	plain := &idemstore.Record{Key: recKey, Response: answer, Request: request}
	if err := idemstore.OpenRecord(nil, plain); err != nil || plain.Response != answer {
		t.Fatalf("OpenRecord with no sealer, plain record: %v", err)
	}
	if err := idemstore.OpenRecord(k, rec); err != nil || !sameResponse(rec.Response, answer) || rec.Request.Query != request.Query {
		t.Fatalf("OpenRecord: %+v, %v", rec, err)
	}
	moved := &idemstore.Record{Key: idemstore.Key{Scope: "x"}, Response: sresp}
	if err := idemstore.OpenRecord(k, moved); !errors.Is(err, idemstore.ErrSealed) || moved.Response != sresp {
		t.Fatalf("OpenRecord of a moved answer: %v", err)
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		keys []idemseal.Key
		want string
	}{
		{nil, "at least one key"},
		{[]idemseal.Key{{ID: "a", Secret: secret(1)[:16]}}, "is 16 bytes"},
		{[]idemseal.Key{{ID: "", Secret: secret(1)}}, "1 to 64 characters"},
		{[]idemseal.Key{{ID: "a b", Secret: secret(1)}}, "only letters"},
		{[]idemseal.Key{{ID: strings.Repeat("x", 65), Secret: secret(1)}}, "1 to 64"},
		{[]idemseal.Key{key1, {ID: "one", Secret: secret(2)}}, "appears twice"},
	} {
		if _, err := idemseal.New(c.keys...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%d keys): %v; want an error with %q", len(c.keys), err, c.want)
		}
	}
}

// A nil *Keyring given as a Sealer (no key configured) behaves as no
// Sealer: it seals nothing, and refuses what is sealed.
func TestNilKeyring(t *testing.T) {
	t.Parallel()
	var none *idemseal.Keyring
	var s idemstore.Sealer = none
	if got, err := s.SealResponse(recKey, answer); got != answer || err != nil {
		t.Fatalf("SealResponse: %+v, %v", got, err)
	}
	if got, err := s.SealRequest(recKey, request); got != request || err != nil {
		t.Fatalf("SealRequest: %+v, %v", got, err)
	}
	if got, err := s.OpenResponse(recKey, answer); got != answer || err != nil {
		t.Fatalf("OpenResponse of a plain answer: %+v, %v", got, err)
	}
	k := ring(t, key1)
	sresp, _ := k.SealResponse(recKey, answer)
	sreq, _ := k.SealRequest(recKey, request)
	if _, err := s.OpenResponse(recKey, sresp); !errors.Is(err, idemstore.ErrSealed) {
		t.Fatalf("OpenResponse of a sealed answer: %v", err)
	}
	if _, err := s.OpenRequest(recKey, sreq); !errors.Is(err, idemstore.ErrSealed) {
		t.Fatalf("OpenRequest of a sealed request: %v", err)
	}
}
