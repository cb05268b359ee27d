package idemstore_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// hiding is a wrapper of a store that passes every call on but hides the
// store's ReadResponse, as a wrapper written before it existed does.
type hiding struct{ idemstore.Store }

// ReadResponse reads through a store's own ReadResponse, or, behind a
// wrapper that hides it, through Get: the answer stored under the token,
// or ErrNotFound once the record holds no answer under it.
func TestReadResponseThroughAWrapper(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	mem := idemmem.MustNew(idemmem.Config{})
	defer mem.Close()
	key := idemstore.Key{Scope: "s", Operation: "op", Key: "k"}
	body := bytes.Repeat([]byte("b"), 64<<10)
	if _, _, err := mem.Reserve(ctx, idemstore.ReserveParams{Key: key, Token: "t1", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := mem.Complete(ctx, idemstore.CompleteParams{Key: key, Token: "t1", Retention: time.Hour, Response: &idemstore.Response{Status: 201, Body: body}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []idemstore.Store{mem, hiding{mem}} {
		rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key, Token: "t2", Lease: time.Minute, InlineResponse: 1 << 10})
		if err != nil || created || rec.Response != nil || rec.ResponseSize == 0 {
			t.Fatalf("%T: Reserve with InlineResponse: %+v, %v, %v; want the answer left out", s, rec, created, err)
		}
		got, err := idemstore.ReadResponse(ctx, s, key, rec.Token)
		if err != nil || got.Status != 201 || !bytes.Equal(got.Body, body) {
			t.Fatalf("%T: ReadResponse: %v, %v", s, got, err)
		}
		if _, err := idemstore.ReadResponse(ctx, s, key, "another"); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("%T: ReadResponse under another token: %v; want ErrNotFound", s, err)
		}
	}
	if _, _, err := mem.Reserve(ctx, idemstore.ReserveParams{Key: idemstore.Key{Scope: "s", Operation: "op", Key: "p"}, Token: "t3", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := idemstore.ReadResponse(context.Background(), hiding{mem}, idemstore.Key{Scope: "s", Operation: "op", Key: "p"}, "t3"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("ReadResponse of a pending record through Get: %v; want ErrNotFound", err)
	}
	if err := mem.Delete(ctx, idemstore.DeleteParams{Key: key}); err != nil {
		t.Fatal(err)
	}
	if _, err := idemstore.ReadResponse(ctx, hiding{mem}, key, "t1"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("ReadResponse of a deleted record through Get: %v; want ErrNotFound", err)
	}
}
