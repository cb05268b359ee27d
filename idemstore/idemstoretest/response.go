package idemstoretest

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// testResponseReader checks stores that read large answers apart
// (idemstore.ResponseReader): Reserve leaves out only answers longer than
// InlineResponse, and ReadResponse returns the answer its record named or
// ErrNotFound, never another one stored for the key since.
func testResponseReader(t *testing.T, h Harness) {
	s := h.New(t)
	rr, ok := s.(idemstore.ResponseReader)
	if !ok {
		t.Skip("the store does not implement idemstore.ResponseReader")
	}
	const inline = 1 << 10
	large := &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/octet-stream"}, "X-A": {"1", "2"}}, Body: bytes.Repeat([]byte("0123456789abcdef"), 4<<10)}
	small := &idemstore.Response{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("small")}

	// completed reserves and completes name with resp, and returns the
	// record as stored.
	completed := func(f *fixture, name string, resp *idemstore.Response) *idemstore.Record {
		return f.complete(f.reserve(f.key(name), leaseLive), resp, time.Hour)
	}
	// again reserves the existing key with InlineResponse inline.
	again := func(f *fixture, k idemstore.Key, inline int) *idemstore.Record {
		t.Helper()
		rec, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: k, Fingerprint: "fp-" + k.Key, Token: newToken(), Lease: leaseLive, InlineResponse: inline})
		if err != nil || created || rec == nil {
			t.Fatalf("Reserve of a completed key: %v, created %v, %v", rec, created, err)
		}
		return rec
	}

	t.Run("LargeLeftOut", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		stored := completed(f, "large", large)
		rec := again(f, stored.Key, inline)
		if rec.Response != nil || rec.ResponseSize <= int64(len(large.Body)) || rec.State != idemstore.StateCompleted || rec.Token != stored.Token {
			t.Fatalf("Reserve with InlineResponse %d of a %d-byte answer: state %s token %q response %s size %d; want completed, %q, none, more than the body",
				inline, len(large.Body), rec.State, rec.Token, summary(rec.Response), rec.ResponseSize, stored.Token)
		}
		got, err := rr.ReadResponse(f.ctx(), rec.Key, rec.Token)
		if err != nil {
			t.Fatalf("ReadResponse: %v", err)
		}
		if d := diffResponse(got, large); d != "" {
			t.Fatalf("ReadResponse: %s", d)
		}
		got.Body[0] = 'X' // the caller's own: the store keeps its answer
		if got, _ := rr.ReadResponse(f.ctx(), rec.Key, rec.Token); got == nil || got.Body[0] != '0' {
			t.Fatal("changing ReadResponse's answer changed the stored one")
		}
		if rec := again(f, stored.Key, 0); rec.ResponseSize != 0 || diffResponse(rec.Response, large) != "" {
			t.Fatalf("Reserve without InlineResponse left the answer out: size %d, response %s", rec.ResponseSize, summary(rec.Response))
		}
	})
	t.Run("SmallKept", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		stored := completed(f, "small", small)
		rec := again(f, stored.Key, inline)
		if rec.ResponseSize != 0 {
			t.Fatalf("a %d-byte answer was left out under InlineResponse %d", len(small.Body), inline)
		}
		if d := diffResponse(rec.Response, small); d != "" {
			t.Fatalf("Reserve with InlineResponse: %s", d)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		// Reserves of completed keys at once (which batching stores
		// group): each large answer left out, each small one kept.
		t.Parallel()
		f := newFixture(t, s)
		big, little := completed(f, "big", large), completed(f, "little", small)
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				want := big
				if i%2 == 1 {
					want = little
				}
				rec, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: want.Key, Fingerprint: "fp-" + want.Key.Key, Token: newToken(), Lease: leaseLive, InlineResponse: inline})
				switch {
				case err != nil || created || rec == nil:
					t.Errorf("Reserve of a completed key: %v, %v", created, err)
				case want == big && (rec.Response != nil || rec.ResponseSize == 0):
					t.Errorf("a large answer reserved at once with others: response %s, size %d; want it left out", summary(rec.Response), rec.ResponseSize)
				case want == little && (rec.ResponseSize != 0 || diffResponse(rec.Response, small) != ""):
					t.Errorf("a small answer reserved at once with others: response %s, size %d; want it whole", summary(rec.Response), rec.ResponseSize)
				}
			})
		}
		wg.Wait()
	})
	t.Run("Boundary", func(t *testing.T) {
		// An answer exactly InlineResponse bytes as stored comes whole;
		// one byte more is left out, and the record says exactly its size.
		t.Parallel()
		f := newFixture(t, s)
		stored := completed(f, "edge", large)
		size := again(f, stored.Key, 1).ResponseSize
		if size <= 1 {
			t.Fatalf("Reserve with InlineResponse 1 of a %d-byte answer: size %d; want it left out", len(large.Body), size)
		}
		rec := again(f, stored.Key, int(size))
		if rec.ResponseSize != 0 || diffResponse(rec.Response, large) != "" {
			t.Fatalf("Reserve with InlineResponse %d, the answer's own size: response %s, size %d; want it whole", size, summary(rec.Response), rec.ResponseSize)
		}
		rec = again(f, stored.Key, int(size-1))
		if rec.Response != nil || rec.ResponseSize != size {
			t.Fatalf("Reserve with InlineResponse %d, one byte short of the answer: response %s, size %d; want it left out, size %d", size-1, summary(rec.Response), rec.ResponseSize, size)
		}
	})
	t.Run("ManyKeysAtOnce", func(t *testing.T) {
		// Reserves of many completed keys at once, large and small (which
		// batching stores answer in one statement): each record says its
		// own answer's size, and each answer read is its own, byte for
		// byte.
		t.Parallel()
		f := newFixture(t, s)
		const n = 24
		recs, answers, sizes := make([]*idemstore.Record, n), make([]*idemstore.Response, n), make([]int64, n)
		for i := range n {
			length := 16 + i
			if i%3 != 0 {
				length = inline + 97*i // large, each of its own length
			}
			body := bytes.Repeat([]byte{byte('a' + i)}, length)
			copy(body, fmt.Sprintf("key %d;", i))
			answers[i] = &idemstore.Response{Status: 200 + i, Header: http.Header{"X-Key": {strconv.Itoa(i)}}, Body: body}
			recs[i] = completed(f, "many-"+strconv.Itoa(i), answers[i])
			sizes[i] = again(f, recs[i].Key, 1).ResponseSize
		}
		var wg sync.WaitGroup
		for round := range 4 {
			for i := range n {
				wg.Go(func() {
					k := recs[i].Key
					// Some callers (idem.Do, the gRPC front door) ask for
					// every answer whole, in the same batches.
					limit := inline
					if (i+round)%4 == 3 {
						limit = 0
					}
					rec, created, err := s.Reserve(f.ctx(), idemstore.ReserveParams{Key: k, Fingerprint: "fp-" + k.Key, Token: newToken(), Lease: leaseLive, InlineResponse: limit})
					if err != nil || created || rec == nil {
						t.Errorf("Reserve of completed key %d: %v, %v", i, created, err)
						return
					}
					if rec.Key != k || rec.Token != recs[i].Token {
						t.Errorf("Reserve of key %d returned the record of %v under token %q", i, rec.Key, rec.Token)
						return
					}
					got := rec.Response
					if limit > 0 && sizes[i] > int64(limit) {
						if got != nil || rec.ResponseSize != sizes[i] {
							t.Errorf("key %d, %d bytes stored: response %s, size %d; want it left out, size %d", i, sizes[i], summary(got), rec.ResponseSize, sizes[i])
							return
						}
						if got, err = rr.ReadResponse(f.ctx(), k, rec.Token); err != nil {
							t.Errorf("ReadResponse of key %d: %v", i, err)
							return
						}
					} else if rec.ResponseSize != 0 {
						t.Errorf("key %d, %d bytes stored: left out (size %d)", i, sizes[i], rec.ResponseSize)
					}
					if d := diffResponse(got, answers[i]); d != "" {
						t.Errorf("key %d: %s", i, d)
					}
				})
			}
		}
		wg.Wait()
	})
	t.Run("GetHead", func(t *testing.T) {
		// idemstore.HeadReader: Get with large answers left out, as
		// Reserve leaves them out.
		t.Parallel()
		hr, ok := s.(idemstore.HeadReader)
		if !ok {
			t.Skip("the store does not implement idemstore.HeadReader")
		}
		f := newFixture(t, s)
		big, little := completed(f, "head-big", large), completed(f, "head-little", small)
		size := again(f, big.Key, 1).ResponseSize
		rec, err := hr.GetHead(f.ctx(), big.Key, inline)
		if err != nil || rec.Response != nil || rec.ResponseSize != size || rec.State != idemstore.StateCompleted || rec.Token != big.Token {
			t.Fatalf("GetHead of a large answer: %v, %v; want it completed under %q, its answer left out, size %d", rec, err, big.Token, size)
		}
		if rec, err := hr.GetHead(f.ctx(), big.Key, 0); err != nil || rec.ResponseSize != 0 || diffResponse(rec.Response, large) != "" {
			t.Fatalf("GetHead with inline 0: %v, %v; want the answer whole", rec, err)
		}
		if rec, err := hr.GetHead(f.ctx(), little.Key, inline); err != nil || rec.ResponseSize != 0 || diffResponse(rec.Response, small) != "" {
			t.Fatalf("GetHead of a small answer: %v, %v; want it whole", rec, err)
		}
		_, err = hr.GetHead(f.ctx(), f.key("head-missing"), inline)
		requireErrIs(t, err, idemstore.ErrNotFound, "GetHead of a missing key")
	})
	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		// Never stored.
		_, err := rr.ReadResponse(f.ctx(), f.key("missing"), newToken())
		requireErrIs(t, err, idemstore.ErrNotFound, "ReadResponse of a missing key")
		// Pending, under its own token.
		p := f.reserve(f.key("pending"), leaseLive)
		_, err = rr.ReadResponse(f.ctx(), p.Key, p.Token)
		requireErrIs(t, err, idemstore.ErrNotFound, "ReadResponse of a pending record")
		// Needs review.
		rv := f.escalate(f.reserve(f.key("review"), leaseLive), "unknown")
		_, err = rr.ReadResponse(f.ctx(), rv.Key, rv.Token)
		requireErrIs(t, err, idemstore.ErrNotFound, "ReadResponse of a record in review")
		// Another token.
		c := completed(f, "other", large)
		_, err = rr.ReadResponse(f.ctx(), c.Key, newToken())
		requireErrIs(t, err, idemstore.ErrNotFound, "ReadResponse under another token")
		// Another key's token: never that key's answer.
		d := completed(f, "another", small)
		_, err = rr.ReadResponse(f.ctx(), d.Key, c.Token)
		requireErrIs(t, err, idemstore.ErrNotFound, "ReadResponse of a key under another key's token")
	})
	t.Run("DeletedAndStoredAgain", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		first := completed(f, "again", large)
		head := again(f, first.Key, inline)
		if err := s.Delete(f.ctx(), idemstore.DeleteParams{Key: first.Key, Token: first.Token}); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		_, err := rr.ReadResponse(f.ctx(), head.Key, head.Token)
		requireErrIs(t, err, idemstore.ErrNotFound, "ReadResponse of a deleted record")
		other := &idemstore.Response{Status: 202, Body: bytes.Repeat([]byte("z"), len(large.Body))}
		second := completed(f, "again", other)
		_, err = rr.ReadResponse(f.ctx(), head.Key, head.Token)
		requireErrIs(t, err, idemstore.ErrNotFound, "ReadResponse, under the first token, of a key completed again")
		got, err := rr.ReadResponse(f.ctx(), second.Key, second.Token)
		if err != nil || diffResponse(got, other) != "" {
			t.Fatalf("ReadResponse under the second token: %s, %v", summary(got), err)
		}
	})
}
