package idemredis

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemseal"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/replaygate"
)

// TestReplayApartInRetentionGrace replays, through the middleware with a
// replay budget (as idem serve does), a large answer, in clear and sealed
// (idemseal), within its retention and once its record is past
// its ExpiresAt but still kept for Config.RetentionGrace: Reserve still
// returns the completed record, as it does for the replay of a small
// answer or a read of the whole record, so ReadResponse must return its
// answer too; refusing it made every round of Begin find the same record
// and fail with ErrRetryable.
func TestReplayApartInRetentionGrace(t *testing.T) {
	t.Parallel()
	keyring, err := idemseal.New(idemseal.Key{ID: "k1", Secret: bytes.Repeat([]byte{7}, idemseal.KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		sealer idemstore.Sealer
	}{{"Clear", nil}, {"Sealed", keyring}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, standaloneClient(t))
			ctx := t.Context()
			eng, err := idem.NewEngine(s, idem.EngineConfig{Logger: quiet, Sealer: c.sealer})
			if err != nil {
				t.Fatal(err)
			}
			runs := newRunCounter()
			h := idem.Middleware(eng, idem.Config{Scope: idem.GlobalScope})(runs.handler(nil))
			withGate := func(key string) *httptest.ResponseRecorder {
				r := httptest.NewRequestWithContext(replaygate.With(context.Background(), idem.NewBudget(1<<20)), http.MethodPost, "/charges", strings.NewReader(`{"amount":1}`))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			check := func(when, how string, rec *httptest.ResponseRecorder) {
				t.Helper()
				if rec.Code != answer16k.Status || rec.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(rec.Body.Bytes(), answer16k.Body) {
					t.Errorf("retry %s, answer %s: %d, replayed %q, %d bytes: %.200s", when, how, rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body.Len(), rec.Body)
				}
			}
			if rec := post(h, "grace"); rec.Code != answer16k.Status {
				t.Fatalf("POST grace: %d %s", rec.Code, rec.Body)
			}
			first := recordOf(t, s, "grace")
			if c.sealer != nil && bytes.Contains(idemstore.EncodeResponse(first.Response), answer16k.Body[:64]) {
				t.Fatal("the answer is stored in clear")
			}
			check("in the retention", "read whole", post(h, "grace"))
			check("in the retention", "read apart", withGate("grace"))
			// The retention ends; the key is kept for the grace that
			// follows it.
			ea := binary.BigEndian.AppendUint64(nil, uint64(time.Now().Add(-time.Second).UnixMicro()))
			if err := s.client.Do(ctx, s.client.B().Setrange().Key(s.recordKey(first.Key)).Offset(offExpiresAt).Value(string(ea)).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			check("in the retention grace", "read whole", post(h, "grace"))
			check("in the retention grace", "read apart", withGate("grace"))
			if n := runs.of("grace"); n != 1 {
				t.Fatalf("grace ran %d times", n)
			}
		})
	}
}

// TestInlineResponseStraddle stores records whose answer starts at every
// offset around the bytes the scripts read at once (inlinePrefix), so that
// the last length before the answer (the reason's, or the label's) lies
// before, across and after that boundary, with and without a scope label
// and a review reason, and reads each apart (Reserve with InlineResponse,
// GetHead, then ReadResponse) and whole: the answer read apart is the
// one Get returns, byte for byte, and the rest of the record is the same,
// standalone and on a Cluster.
func TestInlineResponseStraddle(t *testing.T) {
	t.Parallel()
	for _, topo := range []struct {
		name   string
		client func(testing.TB) rueidis.Client
	}{{"Standalone", standaloneClient}, {"Cluster", clusterClient}} {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			testInlineResponseStraddle(t, newTestStore(t, topo.client(t)))
		})
	}
}

func testInlineResponseStraddle(t *testing.T, s *Store) {
	ctx := t.Context()
	answer := &idemstore.Response{Status: 200, Header: map[string][]string{"X-A": {"1"}}, Body: bytes.Repeat([]byte("0123456789"), 700)}
	enc := idemstore.EncodeResponse(answer)
	n, stored := 0, 0
	for _, label := range []string{"", "label"} {
		for _, reason := range []string{"", "settled by hand"} {
			for at := 4086; at <= 4104; at++ {
				n++
				k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: fmt.Sprintf("straddle-%03d", n)}
				tok := fmt.Sprintf("tok-%03d", n)
				// The answer starts after the fixed head, six or seven
				// lengths and their fields, and the reason's.
				before := fixedHead + 4 + len(tok) + 4*4 + len(k.Operation) + len(k.Scope) + len(k.Key) + len("fp") + 4 + 4 + len(reason)
				if label != "" {
					before += 4 + len(label)
				}
				var req *idemstore.Request
				for body := 0; ; body++ {
					req = &idemstore.Request{Method: "POST", Path: "/x", Body: bytes.Repeat([]byte("r"), body)}
					if l := before + len(idemstore.EncodeRequest(req)); l >= at {
						if l > at {
							req = nil
						}
						break
					}
				}
				if req == nil {
					continue // no request body lands the answer there
				}
				if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute, Request: req, ScopeLabel: label}); err != nil || !created {
					t.Fatalf("Reserve: %v, %v", created, err)
				}
				if reason == "" {
					if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: answer, Retention: time.Hour}); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: "unknown"}); err != nil {
						t.Fatal(err)
					}
					if err := s.Resolve(ctx, idemstore.ResolveParams{Key: k, Action: idemstore.ResolveComplete, Token: tok, Response: answer, Reason: reason, Retention: time.Hour}); err != nil {
						t.Fatal(err)
					}
				}
				l, err := s.client.Do(ctx, s.client.B().Strlen().Key(s.recordKey(k)).Build()).AsInt64()
				if err != nil || int(l) != at+len(enc) {
					t.Fatalf("record of %d bytes (%v), want its answer at %d", l, err, at)
				}
				whole, err := s.Get(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				for _, limit := range []int{1, len(enc) - 1, len(enc)} {
					head, err := s.GetHead(ctx, k, limit)
					if err != nil {
						t.Fatalf("GetHead of an answer at %d, label %q, reason %q: %v", at, label, reason, err)
					}
					checkInline(t, fmt.Sprintf("GetHead of an answer at %d", at), head, whole, answer, len(enc), limit)
					rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "retry", Lease: time.Minute, InlineResponse: limit})
					if err != nil || created {
						t.Fatalf("Reserve of an answer at %d: %v, %v", at, created, err)
					}
					checkInline(t, fmt.Sprintf("Reserve of an answer at %d", at), rec, whole, answer, len(enc), limit)
				}
				stored++
				got, err := s.ReadResponse(ctx, k, tok)
				if err != nil || !bytes.Equal(idemstore.EncodeResponse(got), idemstore.EncodeResponse(whole.Response)) || !bytes.Equal(idemstore.EncodeResponse(got), enc) {
					t.Fatalf("ReadResponse of an answer at %d, label %q, reason %q: %v", at, label, reason, err)
				}
			}
		}
	}
	// A request body of one byte more moves the answer one byte on, but
	// where its length's varint grows.
	if stored < 4*19-4 {
		t.Fatalf("%d records stored, want an answer at almost every offset", stored)
	}
}

// TestReadResponseReplaced reads a large answer apart while other
// goroutines delete the record and store another answer for the key under
// a new token, on a Cluster with the key's own hash tag in its name: an
// answer read apart is always the one stored under the token of the
// record read (each token's answer has its own bytes), or nothing, and a
// read under a replaced token finds nothing.
func TestReadResponseReplaced(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, clusterClient(t))
	ctx := t.Context()
	k := idemstore.Key{Scope: "{tenant}", Operation: "POST /x", Key: "{k}replaced"}
	answerOf := func(tok string) *idemstore.Response {
		return &idemstore.Response{Status: 201, Header: map[string][]string{"X-Token": {tok}}, Body: bytes.Repeat([]byte(tok), 3000)}
	}
	store := func(tok string) {
		t.Helper()
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute}); err != nil || !created {
			t.Fatalf("Reserve %s: %v, %v", tok, created, err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: answerOf(tok), Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	store("t000")
	head, err := s.GetHead(ctx, k, 1024)
	if err != nil || head.Token != "t000" || head.ResponseSize == 0 {
		t.Fatalf("GetHead: %+v, %v", head, err)
	}
	if err := s.Delete(ctx, idemstore.DeleteParams{Key: k, Token: "t000"}); err != nil {
		t.Fatal(err)
	}
	store("t001")
	if got, err := s.ReadResponse(ctx, k, head.Token); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("ReadResponse under a replaced token: %v, %v; want ErrNotFound", got != nil, err)
	}

	const rounds = 200
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 2; i < rounds; i++ {
			prev := fmt.Sprintf("t%03d", i-1)
			if err := s.Delete(ctx, idemstore.DeleteParams{Key: k, Token: prev}); err != nil {
				t.Error(err)
				return
			}
			tok := fmt.Sprintf("t%03d", i)
			if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute}); err != nil || !created {
				t.Errorf("Reserve %s: %v, %v", tok, created, err)
				return
			}
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: answerOf(tok), Retention: time.Hour}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	read := 0
	for {
		select {
		case <-done:
			t.Logf("%d answers read apart while the key changed", read)
			return
		default:
		}
		// GetHead, not Reserve, which would take the key between a
		// Delete and the Reserve that follows it.
		rec, err := s.GetHead(ctx, k, 1024)
		if errors.Is(err, idemstore.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idemstore.StateCompleted {
			continue // between the Reserve and the Complete
		}
		if rec.Response != nil || rec.ResponseSize != int64(len(idemstore.EncodeResponse(answerOf(rec.Token)))) {
			t.Fatalf("GetHead left out %d bytes of %s's answer, response %v", rec.ResponseSize, rec.Token, rec.Response != nil)
		}
		got, err := s.ReadResponse(ctx, k, rec.Token)
		if errors.Is(err, idemstore.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(idemstore.EncodeResponse(got), idemstore.EncodeResponse(answerOf(rec.Token))) {
			t.Fatalf("ReadResponse under %s returned the answer of %v", rec.Token, got.Header["X-Token"])
		}
		read++
	}
}

// TestReadApartUnknownLayout reads a record of a later layout (its first
// byte unknown) apart: GetHead, Reserve with InlineResponse and
// ReadResponse refuse it with an error, as Get does, rather than take it
// for a record or for no record.
func TestReadApartUnknownLayout(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: "later layout"}
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute}); err != nil || !created {
		t.Fatalf("Reserve: %v, %v", created, err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: answer16k, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.client.Do(ctx, s.client.B().Setrange().Key(s.recordKey(k)).Offset(0).Value("\x03").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, k); err == nil || errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("Get of a later layout: %v", err)
	}
	if rec, err := s.GetHead(ctx, k, 1024); err == nil || errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("GetHead of a later layout: %+v, %v", rec, err)
	}
	if rec, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "retry", Lease: time.Minute, InlineResponse: 1024}); err == nil || errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("Reserve with InlineResponse of a later layout: %+v, %v", rec, err)
	}
	if resp, err := s.ReadResponse(ctx, k, "tok"); err == nil || errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("ReadResponse of a later layout: %v, %v", resp != nil, err)
	}
}

// TestReadApartLongToken reads apart answers of records whose token ends
// before, at and after the bytes ReadResponse reads at once (the token is
// the first field, fenced before the answer is read) and one whose token
// is longer than those bytes: each reads apart as Get reads it, and a
// token one byte shorter or longer reads nothing.
func TestReadApartLongToken(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	answer := &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("y"), 9000)}
	for _, l := range []int{4096 - 56, 4096 - 55, 4096 - 54, 4096 - 53, 4096 - 52, 5000} {
		tok := strings.Repeat("T", l-1) + "!"
		k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: fmt.Sprintf("token of %d bytes", l)}
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute}); err != nil || !created {
			t.Fatalf("Reserve: %v, %v", created, err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: answer, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		whole, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		head, err := s.GetHead(ctx, k, 1024)
		if err != nil {
			t.Fatal(err)
		}
		checkInline(t, fmt.Sprintf("GetHead with a token of %d bytes", l), head, whole, answer, len(idemstore.EncodeResponse(answer)), 1024)
		got, err := s.ReadResponse(ctx, k, head.Token)
		if err != nil || !bytes.Equal(idemstore.EncodeResponse(got), idemstore.EncodeResponse(whole.Response)) {
			t.Fatalf("ReadResponse with a token of %d bytes: %v", l, err)
		}
		for _, other := range []string{tok[:l-1], tok + "!", strings.Repeat("T", l)} {
			if _, err := s.ReadResponse(ctx, k, other); !errors.Is(err, idemstore.ErrNotFound) {
				t.Fatalf("ReadResponse with a token of %d bytes under one of %d: %v; want ErrNotFound", l, len(other), err)
			}
		}
	}
}
