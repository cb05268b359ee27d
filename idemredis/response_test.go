package idemredis

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// withoutAnswer is rec with its answer, its size and its read time taken
// out, to compare what else two reads of one record say.
func withoutAnswer(rec *idemstore.Record) idemstore.Record {
	c := *rec
	c.Response, c.ResponseSize, c.ReadAt = nil, 0, time.Time{}
	return c
}

// checkInline checks a record read with the answer of want, as stored
// (enc bytes), left out when it is longer than limit: whole otherwise,
// and in both cases what whole, the record read with Get, says besides.
func checkInline(t *testing.T, what string, got, whole *idemstore.Record, want *idemstore.Response, enc, limit int) {
	t.Helper()
	if !reflect.DeepEqual(withoutAnswer(got), withoutAnswer(whole)) {
		t.Fatalf("%s with limit %d: %+v; want what Get says, %+v", what, limit, withoutAnswer(got), withoutAnswer(whole))
	}
	if enc > limit {
		if got.Response != nil || got.ResponseSize != int64(enc) {
			t.Fatalf("%s with limit %d of a %d-byte answer: response %v, size %d; want it left out, size %d", what, limit, enc, got.Response != nil, got.ResponseSize, enc)
		}
		return
	}
	if got.ResponseSize != 0 || got.Response == nil || !reflect.DeepEqual(got.Response, whole.Response) || !bytes.Equal(got.Response.Body, want.Body) {
		t.Fatalf("%s with limit %d of a %d-byte answer: size %d, response %v; want it whole", what, limit, enc, got.ResponseSize, got.Response != nil)
	}
}

// TestInlineResponseLayouts stores records of every shape the scripts
// walk to find the answer (with and without a scope label, requests and
// answers that end before, at and past the bytes readInline reads at
// once) and reads each with InlineResponse and GetHead at limits around
// its answer's size: the answer is left out exactly when it is longer
// than the limit, its size is the stored answer's, everything else the
// record says is what Get says, and ReadResponse returns the answer.
func TestInlineResponseLayouts(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name   string
		client func(testing.TB) rueidis.Client
	}{{"Standalone", standaloneClient}, {"Cluster", clusterClient}} {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, topo.client(t))
			ctx := t.Context()
			prefix := 4096 // inlinePrefix
			n := 0
			store := func(label string, reqBody, answerBody int) (idemstore.Key, *idemstore.Response, string) {
				t.Helper()
				n++
				k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: fmt.Sprintf("k%04d", n)}
				req := &idemstore.Request{Method: "POST", Path: "/x", Body: bytes.Repeat([]byte("r"), reqBody)}
				if reqBody == 0 {
					req = nil
				}
				resp := &idemstore.Response{Status: 201, Header: map[string][]string{"X-N": {fmt.Sprintf("%04d", n)}}, Body: bytes.Repeat([]byte{byte('a' + n%26)}, answerBody)}
				tok := fmt.Sprintf("tok-%04d", n)
				if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute, Request: req, ScopeLabel: label}); err != nil || !created {
					t.Fatalf("Reserve: %v, %v", created, err)
				}
				if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: resp, Retention: time.Hour}); err != nil {
					t.Fatal(err)
				}
				return k, resp, tok
			}
			strlen := func(k idemstore.Key) int {
				t.Helper()
				l, err := s.client.Do(ctx, s.client.B().Strlen().Key(s.recordKey(k)).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				return int(l)
			}
			check := func(k idemstore.Key, resp *idemstore.Response, tok string) {
				t.Helper()
				whole, err := s.Get(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				enc := len(idemstore.EncodeResponse(resp))
				for _, limit := range []int{1, enc - 1, enc, enc + 1, 1 << 20} {
					if limit <= 0 {
						continue
					}
					rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "retry", Lease: time.Minute, InlineResponse: limit})
					if err != nil || created {
						t.Fatalf("Reserve of a completed key: %v, %v", created, err)
					}
					checkInline(t, "Reserve", rec, whole, resp, enc, limit)
					head, err := s.GetHead(ctx, k, limit)
					if err != nil {
						t.Fatal(err)
					}
					checkInline(t, "GetHead", head, whole, resp, enc, limit)
				}
				got, err := s.ReadResponse(ctx, k, tok)
				if err != nil || !reflect.DeepEqual(got, whole.Response) {
					t.Fatalf("ReadResponse: %+v, %v; want %+v", got, err, whole.Response)
				}
			}
			for _, label := range []string{"", "acme"} {
				for _, reqBody := range []int{0, 40, 2 * prefix} {
					for _, answerBody := range []int{0, 5, prefix - 300, 5 * prefix} {
						k, resp, tok := store(label, reqBody, answerBody)
						check(k, resp, tok)
					}
					// Records that end one byte before, at and after the
					// prefix read at once.
					// (The answer's encoding gives its body's length in as
					// many bytes for 2000 as near the prefix.)
					k, _, _ := store(label, reqBody, 2000)
					base := strlen(k) - 2000
					for _, total := range []int{prefix - 1, prefix, prefix + 1} {
						if total-base < 0 {
							continue
						}
						k, resp, tok := store(label, reqBody, total-base)
						if l := strlen(k); l != total {
							t.Fatalf("record of %d bytes, want %d", l, total)
						}
						check(k, resp, tok)
					}
				}
			}
		})
	}
}

// TestReadResponseFence checks that ReadResponse returns an answer only
// while its record is completed under the token asked for (whose
// retention may be over while its key lasts, as Reserve returns it), and
// that a hostile token reads nothing.
func TestReadResponseFence(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	answer := &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("z"), 10000)}
	key := func(name string) idemstore.Key {
		return idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: name}
	}
	reserve := func(k idemstore.Key, tok string) {
		t.Helper()
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute}); err != nil || !created {
			t.Fatalf("Reserve: %v, %v", created, err)
		}
	}
	notFound := func(what string, k idemstore.Key, tok string) {
		t.Helper()
		if got, err := s.ReadResponse(ctx, k, tok); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("ReadResponse of %s: %v, %v; want ErrNotFound", what, got != nil, err)
		}
	}

	pending := key("pending")
	reserve(pending, "tok")
	notFound("a pending record", pending, "tok")
	if rec, err := s.GetHead(ctx, pending, 1); err != nil || rec.State != idemstore.StatePending || rec.ResponseSize != 0 {
		t.Fatalf("GetHead of a pending record: %+v, %v", rec, err)
	}

	review := key("review")
	reserve(review, "tok")
	if err := s.Escalate(ctx, idemstore.EscalateParams{Key: review, Token: "tok", Reason: "unknown outcome"}); err != nil {
		t.Fatal(err)
	}
	notFound("a record in review", review, "tok")
	// Resolved with an answer: the record keeps its reason, before the
	// answer.
	if err := s.Resolve(ctx, idemstore.ResolveParams{Key: review, Action: idemstore.ResolveComplete, Token: "tok", Response: answer, Reason: "settled by hand", Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.GetHead(ctx, review, 1); err != nil || rec.Reason != "settled by hand" || rec.ResponseSize != int64(len(idemstore.EncodeResponse(answer))) {
		t.Fatalf("GetHead of a resolved record: %+v, %v", rec, err)
	}
	if got, err := s.ReadResponse(ctx, review, "tok"); err != nil || !bytes.Equal(got.Body, answer.Body) {
		t.Fatalf("ReadResponse of a resolved record: %v", err)
	}

	done := key("done")
	reserve(done, "tok")
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: done, Token: "tok", Response: answer, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	notFound("another token", done, "tok2")
	notFound("a token that is a prefix of the record's", done, "to")
	notFound("no token", done, "")
	notFound("a token longer than the bytes read at once", done, strings.Repeat("t", 10000))
	notFound("a key never stored", key("never"), "tok")
	if got, err := s.ReadResponse(ctx, done, "tok"); err != nil || !bytes.Equal(got.Body, answer.Body) {
		t.Fatalf("ReadResponse under its token: %v", err)
	}

	over := key("retention over")
	reserve(over, "tok")
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: over, Token: "tok", Response: answer, Retention: -time.Second}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.GetHead(ctx, over, 1); err != nil || rec.ResponseSize == 0 {
		t.Fatalf("GetHead of a record whose retention is over: %+v, %v; want it, its answer left out", rec, err)
	}
	// Reserve and Get return it while its key lasts (RetentionGrace):
	// its answer reads too.
	if got, err := s.ReadResponse(ctx, over, "tok"); err != nil || !bytes.Equal(got.Body, answer.Body) {
		t.Fatalf("ReadResponse of a record whose retention is over, still kept: %v", err)
	}
}

// TestInlineResponseLegacy reads completed records of the previous
// version (hashes, see legacy.go) with InlineResponse, GetHead and
// ReadResponse: a large answer is left out with its size as stored, a
// small one comes whole (an answer exactly the limit long too), the answer
// reads under its token only, also past its retention while the hash is
// kept, and no read rewrites the hash.
func TestInlineResponseLegacy(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	old := oldWriter{t, s}
	ctx := t.Context()
	large := &idemstore.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: bytes.Repeat([]byte("0123456789abcdef"), 1024)}
	small := &idemstore.Response{Status: 200, Body: []byte(`{"ok":true}`)}
	const limit = 1024

	for _, c := range []struct {
		name string
		resp *idemstore.Response
	}{{"large", large}, {"small", small}} {
		k := old.reserve("legacy "+c.name, "tok", time.Hour)
		old.complete(k, "tok", c.resp, time.Hour)
		whole, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		enc := len(idemstore.EncodeResponse(c.resp))
		for _, limit := range []int{limit, enc - 1, enc} {
			rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp-legacy " + c.name, Token: "retry", Lease: time.Minute, InlineResponse: limit})
			if err != nil || created {
				t.Fatalf("Reserve of an old completed key: %v, %v", created, err)
			}
			checkInline(t, "Reserve of a "+c.name+" old record", rec, whole, c.resp, enc, limit)
			head, err := s.GetHead(ctx, k, limit)
			if err != nil {
				t.Fatal(err)
			}
			checkInline(t, "GetHead of a "+c.name+" old record", head, whole, c.resp, enc, limit)
		}
		got, err := s.ReadResponse(ctx, k, "tok")
		if err != nil || !reflect.DeepEqual(got, whole.Response) {
			t.Fatalf("ReadResponse of a %s old record: %+v, %v", c.name, got, err)
		}
		if got, err := s.ReadResponse(ctx, k, "retry"); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("ReadResponse of an old record under another token: %v, %v", got != nil, err)
		}
		if typ := keyType(t, s, k); typ != "hash" {
			t.Fatalf("an old completed record read apart became a %s", typ)
		}
	}

	pending := old.reserve("legacy pending", "tok", time.Hour)
	if got, err := s.ReadResponse(ctx, pending, "tok"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("ReadResponse of an old pending record: %v, %v", got != nil, err)
	}
	if rec, err := s.GetHead(ctx, pending, 1); err != nil || rec.State != idemstore.StatePending || rec.ResponseSize != 0 {
		t.Fatalf("GetHead of an old pending record: %+v, %v", rec, err)
	}

	over := old.reserve("legacy retention over", "tok", time.Hour)
	old.complete(over, "tok", large, -time.Second)
	if got, err := s.ReadResponse(ctx, over, "tok"); err != nil || !bytes.Equal(got.Body, large.Body) {
		t.Fatalf("ReadResponse of an old record whose retention is over, still kept: %v", err)
	}
}
