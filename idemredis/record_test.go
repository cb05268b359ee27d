package idemredis

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// TestLargeValues drives records whose parts pass the sizes at which the
// scripts stop concatenating in Lua (smallValue): a stored request and an
// answer of 16 KiB, a token and an operation longer than the prefix that
// Complete and the listings read first, through every script.
func TestLargeValues(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	big := bytes.Repeat([]byte("x"), 16<<10)
	answer := &idemstore.Response{Status: 200, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: big}
	huge := &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("h"), 2<<20)}
	for _, c := range []struct {
		name, token, operation string
		request                []byte
		answer                 *idemstore.Response
	}{
		{"huge answer", "tok", "POST /x", big, huge},
		{"long key " + strings.Repeat("k", 2000), "tok", "POST /x", nil, answer},
		{"small", "tok", "POST /x", []byte(`{}`), &idemstore.Response{Status: 201, Body: []byte(`{"id":1}`)}},
		{"large request", "tok", "POST /x", big, &idemstore.Response{Status: 201}},
		{"large answer", "tok", "POST /x", nil, answer},
		{"both large", "tok", "POST /x", big, answer},
		{"long token", strings.Repeat("t", 1000), "POST /x", nil, answer},
		{"long operation", "tok", "POST /" + strings.Repeat("o", 1000), big, &idemstore.Response{Status: 201}},
	} {
		t.Run(c.name[:min(len(c.name), 20)], func(t *testing.T) {
			k := idemstore.Key{Scope: "tenant " + c.name, Operation: c.operation, Key: c.name}
			req := &idemstore.Request{Method: "POST", Path: "/x", Body: c.request}
			if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: c.token, Lease: time.Minute, Request: req}); err != nil || !created {
				t.Fatalf("Reserve: created %v, %v", created, err)
			}
			if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: c.token, Lease: time.Hour}); err != nil {
				t.Fatalf("Extend: %v", err)
			}
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "not " + c.token, Response: c.answer}); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("Complete with another token: %v", err)
			}
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: c.token, Response: c.answer, Retention: time.Hour}); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "retry", Lease: time.Minute})
			if err != nil || created {
				t.Fatalf("retry: created %v, %v", created, err)
			}
			if rec.Token != c.token || rec.Key != k || rec.State != idemstore.StateCompleted ||
				!bytes.Equal(rec.Response.Body, c.answer.Body) || rec.Response.Status != c.answer.Status ||
				rec.Request == nil || !bytes.Equal(rec.Request.Body, c.request) || rec.LeaseUntil.Sub(rec.UpdatedAt) > time.Hour {
				t.Fatalf("retry read %+v", rec)
			}
			page, err := s.List(ctx, idemstore.ListParams{Operation: c.operation, Limit: 10})
			if err != nil || len(page.Records) != 1 || page.Records[0].Key != k || !bytes.Equal(page.Records[0].Response.Body, c.answer.Body) {
				t.Fatalf("List by operation: %v, %v", page.Records, err)
			}
			if err := s.Delete(ctx, idemstore.DeleteParams{Key: k, Token: c.token[:len(c.token)-1]}); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("Delete with a prefix of the token: %v", err)
			}
			if err := s.Delete(ctx, idemstore.DeleteParams{Key: k, Token: c.token}); err != nil {
				t.Fatalf("Delete: %v", err)
			}
		})
	}
	t.Run("escalated and resolved", func(t *testing.T) {
		k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: "review"}
		req := &idemstore.Request{Method: "POST", Path: "/x", Body: big}
		if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute, Request: req}); err != nil || !created {
			t.Fatalf("Reserve: created %v, %v", created, err)
		}
		reason := strings.Repeat("r", 1000)
		if err := s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok", Reason: reason}); err != nil {
			t.Fatal(err)
		}
		if err := s.Resolve(ctx, idemstore.ResolveParams{Key: k, Token: "tok", Action: idemstore.ResolveComplete, Response: answer, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(ctx, k)
		if err != nil || rec.Reason != reason || !bytes.Equal(rec.Response.Body, big) || !bytes.Equal(rec.Request.Body, big) {
			t.Fatalf("after Resolve: %v", err)
		}
	})
}

// TestForeignValues checks what the store does with values it did not
// write under a record's name: a string of an unknown layout or too short
// for one, and a key of another type. Every call that reads it fails; none
// takes it for a missing record (which would let a request run) or
// overwrites it.
func TestForeignValues(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	for name, put := range map[string]func(key string) error{
		"later layout": func(key string) error {
			return s.client.Do(ctx, s.client.B().Set().Key(key).Value("\x03p"+strings.Repeat("\x00", 100)).Build()).Error()
		},
		"short string": func(key string) error {
			return s.client.Do(ctx, s.client.B().Set().Key(key).Value("\x01p").Build()).Error()
		},
		"list": func(key string) error {
			return s.client.Do(ctx, s.client.B().Rpush().Key(key).Element("x").Build()).Error()
		},
	} {
		t.Run(name, func(t *testing.T) {
			k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: name}
			if err := put(s.recordKey(k)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Get(ctx, k); err == nil || errors.Is(err, idemstore.ErrNotFound) {
				t.Errorf("Get: %v, want an error", err)
			}
			if rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute}); err == nil {
				t.Errorf("Reserve: %+v, created %v, want an error", rec, created)
			}
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: &idemstore.Response{Status: 200}}); err == nil {
				t.Error("Complete succeeded")
			}
			if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok"}); err == nil {
				t.Error("Release succeeded")
			}
			if _, err := s.Purge(ctx, idemstore.PurgeParams{}); err == nil {
				t.Error("Purge succeeded")
			}
			if err := s.client.Do(ctx, s.client.B().Del().Key(s.recordKey(k)).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// FuzzDecodeRecord feeds decodeRecord and summaryOf arbitrary bytes: they
// return an error or a record, never panic, and a record they return
// encodes its key and token as read.
func FuzzDecodeRecord(f *testing.F) {
	k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: "k"}
	tail := pendingTail(k, "tok", "fp", idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/x"}), "")
	head := []byte{recordLayout, 'p', 0}
	for range 4 {
		head = binary.BigEndian.AppendUint64(head, 1_700_000_000_000_000)
	}
	rec := append(head, tail...)
	f.Add(rec)
	f.Add(append(append([]byte(nil), rec...), idemstore.EncodeResponse(&idemstore.Response{Status: 201, Body: []byte("ok")})...))
	f.Add(rec[:fixedHead+2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeRecord(string(b), time.Unix(1, 0))
		if err == nil && (got == nil || !got.State.Valid()) {
			t.Fatalf("decodeRecord(%q) = %+v without an error", b, got)
		}
		_, _, _ = summaryOf(string(b))
	})
}

// TestRecordMemory checks that a record takes about its length in the
// server's memory, whatever the sizes of its request and answer: a string
// that a script grew with APPEND or SETRANGE would hold twice its length
// until it expired, and halve what a server under noeviction can keep.
func TestRecordMemory(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	for _, c := range []struct {
		name            string
		request, answer int
	}{
		{"small", 10, 10},
		{"large request", 16 << 10, 10},
		{"large answer", 10, 16 << 10},
		{"both large", 16 << 10, 16 << 10},
		{"answer past 1 MiB", 10, 3 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: c.name}
			key := s.recordKey(k)
			// usage returns the server's memory for the record and its
			// length.
			usage := func() (mem, size int64) {
				t.Helper()
				mem, err := s.client.Do(ctx, s.client.B().MemoryUsage().Key(key).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				size, err = s.client.Do(ctx, s.client.B().Strlen().Key(key).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				return mem, size
			}
			check := func(when string) {
				t.Helper()
				// The allocator's size classes and the object's header
				// add up to a quarter, or 4 KiB past a page.
				if mem, size := usage(); mem > size+size/4+4096 {
					t.Errorf("after %s, the record of %d bytes takes %d bytes of memory", when, size, mem)
				}
			}
			req := &idemstore.Request{Method: "POST", Path: "/x", Body: bytes.Repeat([]byte("q"), c.request)}
			if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute, Request: req}); err != nil || !created {
				t.Fatalf("Reserve: created %v, %v", created, err)
			}
			check("Reserve")
			if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", Lease: time.Hour}); err != nil {
				t.Fatal(err)
			}
			resp := &idemstore.Response{Status: 200, Body: bytes.Repeat([]byte("a"), c.answer)}
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: resp, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
			check("Complete")
			rec, err := s.Get(ctx, k)
			if err != nil || !bytes.Equal(rec.Response.Body, resp.Body) || !bytes.Equal(rec.Request.Body, req.Body) || rec.State != idemstore.StateCompleted {
				t.Fatalf("Get after Complete: %v", err)
			}
			if n, err := s.client.Do(ctx, s.client.B().Exists().Key(s.keys(k).scratch).Build()).AsInt64(); err != nil || n != 0 {
				t.Errorf("the scratch key is left: EXISTS %d, %v", n, err)
			}
		})
	}
}

// TestTruncatedRecords cuts a completed record at every length and flips
// its length fields: every read by key fails with an error that is not
// ErrNotFound (which would let a retry run) and none replays an answer,
// and the listings fail rather than skip or misread the record.
func TestTruncatedRecords(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: "cut"}
	req := &idemstore.Request{Method: "POST", Path: "/x", Body: []byte(`{"amount":1}`)}
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute, Request: req}); err != nil || !created {
		t.Fatalf("Reserve: created %v, %v", created, err)
	}
	resp := &idemstore.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_1"}`)}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: resp, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	key := s.recordKey(k)
	whole, err := s.client.Do(ctx, s.client.B().Get().Key(key).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	variants := map[string]string{}
	for n := 1; n < len(whole); n++ {
		variants[fmt.Sprintf("cut at %d", n)] = whole[:n]
	}
	// Each length field of the record after the fixed head, made longer
	// by one and as long as it can be.
	for i, at := 0, fixedHead; i < 7; i++ {
		l := int(binary.BigEndian.Uint32([]byte(whole[at:])))
		for _, v := range []uint32{uint32(l + 1), 1<<32 - 1} {
			b := []byte(whole)
			binary.BigEndian.PutUint32(b[at:], v)
			variants[fmt.Sprintf("field %d length %d", i, v)] = string(b)
		}
		at += 4 + l
	}
	for name, v := range variants {
		if err := s.client.Do(ctx, s.client.B().Set().Key(key).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if rec, err := s.Get(ctx, k); err == nil || errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("%s: Get = %+v, %v; want an error", name, rec, err)
		}
		if rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "retry", Lease: time.Minute}); err == nil {
			t.Errorf("%s: Reserve = %+v, created %v; want an error", name, rec, created)
		}
		if page, err := s.List(ctx, idemstore.ListParams{Limit: 10}); err == nil {
			t.Errorf("%s: List = %d records; want an error", name, len(page.Records))
		}
	}
	if err := s.client.Do(ctx, s.client.B().Del().Key(key).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}
