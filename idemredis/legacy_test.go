package idemredis

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// The scripts of the previous version of the store, which kept a record as
// a hash (see legacy.go), as it ran them: records written by them are what
// a store upgraded in place finds.
const oldClock = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function us(n) return string.format('%.0f', n) end
`

var (
	oldReserve = rueidis.NewLuaScript(oldClock + `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[1], 'o', ARGV[2], 'k', ARGV[3], 'fp', ARGV[4],
  'st', 'pending', 'tok', ARGV[5], 'lu', us(now + tonumber(ARGV[6])), 'ca', us(now), 'ua', us(now))
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'req', ARGV[7]) end
return 1
`)
	oldFence = oldClock + `
local v = redis.call('HMGET', KEYS[1], 'st', 'tok', 'lu', 'lc')
if v[1] ~= 'pending' or v[2] ~= ARGV[3] then return 0 end
`
	oldComplete = rueidis.NewLuaScript(oldFence + `
redis.call('HSET', KEYS[1], 'st', 'completed', 'resp', ARGV[6], 'ea', us(now + tonumber(ARGV[7])),
  'ua', us(now), 'lc', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[8])
redis.call(ARGV[2], ARGV[1], 'completed')
return 1
`)
	oldEscalate = rueidis.NewLuaScript(oldFence + `
redis.call('HSET', KEYS[1], 'st', 'needs_review', 'rsn', ARGV[6], 'ua', us(now), 'lc', ARGV[4])
redis.call(ARGV[2], ARGV[1], 'needs_review')
return 1
`)
)

// oldWriter writes records as the previous version of the store did.
type oldWriter struct {
	t *testing.T
	s *Store
}

func (w oldWriter) exec(script *rueidis.Lua, k idemstore.Key, args ...string) {
	w.t.Helper()
	names := w.s.keys(k)
	n, err := script.Exec(w.t.Context(), w.s.client, []string{names.record, names.tombstone}, args).AsInt64()
	if err != nil || n != 1 {
		w.t.Fatalf("old script on %v: %d, %v", k, n, err)
	}
}

// reserve writes a pending record of name under token, leased for lease,
// with a request.
func (w oldWriter) reserve(name, token string, lease time.Duration) idemstore.Key {
	w.t.Helper()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: name}
	req := idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/charges", Body: []byte(`{"amount":1}`)})
	w.exec(oldReserve, k, k.Scope, k.Operation, k.Key, "fp-"+name, token, durMicros(lease), string(req))
	return k
}

func (w oldWriter) complete(k idemstore.Key, token string, resp *idemstore.Response, retention time.Duration) {
	w.t.Helper()
	w.exec(oldComplete, k, w.s.channel(k), "SPUBLISH", token, "old-call-id-0000000000000000000", "",
		string(idemstore.EncodeResponse(resp)), durMicros(retention), w.s.ttlMillis(retention))
}

func (w oldWriter) escalate(k idemstore.Key, token, reason string) {
	w.t.Helper()
	w.exec(oldEscalate, k, w.s.channel(k), "SPUBLISH", token, "old-call-id-0000000000000000000", "", reason)
}

// keyType returns the Redis type of the record of k.
func keyType(t *testing.T, s *Store, k idemstore.Key) string {
	t.Helper()
	typ, err := s.client.Do(t.Context(), s.client.B().Type().Key(s.recordKey(k)).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	return typ
}

// TestLegacyRecords writes records as the previous version of the store
// did (hashes) and drives every operation of this version over them: they
// read with every field, settle as records of this version would, and are
// rewritten in the new layout when a change is made.
func TestLegacyRecords(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	old := oldWriter{t, s}
	ctx := t.Context()
	answer := &idemstore.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_1"}`)}

	t.Run("pending reads whole and completes", func(t *testing.T) {
		k := old.reserve("pending", "tok", time.Hour)
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idemstore.StatePending || rec.Token != "tok" || rec.Fingerprint != "fp-pending" || rec.Key != k ||
			rec.Request == nil || string(rec.Request.Body) != `{"amount":1}` || !rec.UpdatedAt.Equal(rec.CreatedAt) ||
			rec.LeaseUntil.Sub(rec.CreatedAt) != time.Hour {
			t.Fatalf("old pending record read as %+v", rec)
		}
		if got, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp-pending", Token: "other", Lease: time.Minute}); err != nil || created || got.Token != "tok" {
			t.Fatalf("Reserve over the old record: %+v, created %v, %v", got, created, err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: answer, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		rec, err = s.Get(ctx, k)
		if err != nil || rec.State != idemstore.StateCompleted || rec.Response.Status != 201 || string(rec.Response.Body) != `{"id":"ch_1"}` ||
			rec.Request == nil || rec.Fingerprint != "fp-pending" || rec.ExpiresAt.Sub(rec.UpdatedAt) != time.Hour {
			t.Fatalf("after Complete: %+v, %v", rec, err)
		}
		if typ := keyType(t, s, k); typ != "string" {
			t.Errorf("completed record is a %s, want it rewritten as a string", typ)
		}
		ms, err := s.client.Do(ctx, s.client.B().Pttl().Key(s.recordKey(k)).Build()).AsInt64()
		if ttl := time.Duration(ms) * time.Millisecond; err != nil || ttl <= time.Hour || ttl > time.Hour+s.cfg.RetentionGrace {
			t.Errorf("PTTL after Complete = %dms, %v; want retention + grace", ms, err)
		}
	})

	t.Run("pending expires, extends and is taken over", func(t *testing.T) {
		k := old.reserve("taken over", "tok", -time.Second)
		expired, err := s.ListExpiredLeases(ctx, 100)
		if err != nil || len(expired) != 1 || expired[0].Key != k || expired[0].Token != "tok" {
			t.Fatalf("ListExpiredLeases: %v, %v", expired, err)
		}
		if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", Lease: -time.Second}); err != nil {
			t.Fatal(err)
		}
		expired, err = s.ListExpiredLeases(ctx, 100)
		if err != nil || len(expired) != 1 || expired[0].Key != k {
			t.Fatalf("ListExpiredLeases after Extend: %v, %v", expired, err)
		}
		if err := s.Takeover(ctx, idemstore.TakeoverParams{Key: k, OldToken: "tok", NewToken: "tok-2", Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(ctx, k)
		if err != nil || rec.Token != "tok-2" || rec.LeaseExpired() || rec.Fingerprint != "fp-taken over" || rec.Request == nil {
			t.Fatalf("after Takeover: %+v, %v", rec, err)
		}
	})

	t.Run("pending releases", func(t *testing.T) {
		k := old.reserve("released", "tok", time.Hour)
		if err := s.Release(ctx, idemstore.ReleaseParams{Key: k, Token: "tok"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, k); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("after Release: %v", err)
		}
	})

	t.Run("pending escalates and resolves", func(t *testing.T) {
		k := old.reserve("escalated", "tok", time.Hour)
		if err := s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: "tok", Reason: "timeout"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Resolve(ctx, idemstore.ResolveParams{Key: k, Token: "tok", Action: idemstore.ResolveComplete, Response: answer, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(ctx, k)
		if err != nil || rec.State != idemstore.StateCompleted || rec.Reason != "timeout" || rec.Response.Status != 201 {
			t.Fatalf("after Resolve: %+v, %v", rec, err)
		}
	})

	t.Run("needs review resolves", func(t *testing.T) {
		for name, action := range map[string]idemstore.ResolveAction{"complete": idemstore.ResolveComplete, "release": idemstore.ResolveRelease} {
			k := old.reserve("review "+name, "tok", time.Hour)
			old.escalate(k, "tok", "unknown outcome")
			page, err := s.List(ctx, idemstore.ListParams{State: idemstore.StateNeedsReview, Limit: 100})
			if err != nil || !hasKey(page.Records, k) {
				t.Fatalf("List of records in review: %v, %v", page.Records, err)
			}
			if err := s.Resolve(ctx, idemstore.ResolveParams{Key: k, Token: "tok", Action: action, Response: answer, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
			rec, err := s.Get(ctx, k)
			if action == idemstore.ResolveRelease {
				if !errors.Is(err, idemstore.ErrNotFound) {
					t.Fatalf("after Resolve release: %+v, %v", rec, err)
				}
				continue
			}
			if err != nil || rec.State != idemstore.StateCompleted || rec.Reason != "unknown outcome" {
				t.Fatalf("after Resolve complete: %+v, %v", rec, err)
			}
		}
	})

	t.Run("completed replays, purges and deletes", func(t *testing.T) {
		live := old.reserve("completed", "tok", time.Hour)
		old.complete(live, "tok", answer, time.Hour)
		rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: live, Fingerprint: "fp-completed", Token: "retry", Lease: time.Minute})
		if err != nil || created || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != `{"id":"ch_1"}` ||
			rec.Request == nil || rec.ExpiresAt.Sub(rec.UpdatedAt) != time.Hour {
			t.Fatalf("retry of the old completed key: %+v, created %v, %v", rec, created, err)
		}
		over := old.reserve("retention over", "tok", time.Hour)
		old.complete(over, "tok", answer, -time.Second)
		// Records of this version beside them, in the same listings.
		overNew := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: "retention over, new"}
		liveNew := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: "completed, new"}
		for k, retention := range map[idemstore.Key]time.Duration{overNew: -time.Second, liveNew: time.Hour} {
			if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok", Lease: time.Minute}); err != nil || !created {
				t.Fatalf("Reserve %v: %v, %v", k, created, err)
			}
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: answer, Retention: retention}); err != nil {
				t.Fatal(err)
			}
		}
		page, err := s.List(ctx, idemstore.ListParams{State: idemstore.StateCompleted, Limit: 100})
		if err != nil || !hasKey(page.Records, live) || !hasKey(page.Records, over) || !hasKey(page.Records, overNew) || !hasKey(page.Records, liveNew) {
			t.Fatalf("List of completed records: %v, %v", page.Records, err)
		}
		if n, err := s.Purge(ctx, idemstore.PurgeParams{}); err != nil || n < 2 {
			t.Fatalf("Purge: %d, %v", n, err)
		}
		for _, k := range []idemstore.Key{over, overNew} {
			if _, err := s.Get(ctx, k); !errors.Is(err, idemstore.ErrNotFound) {
				t.Fatalf("purged record %v: %v", k, err)
			}
		}
		for _, k := range []idemstore.Key{live, liveNew} {
			if _, err := s.Get(ctx, k); err != nil {
				t.Fatalf("record %v within its retention after Purge: %v", k, err)
			}
		}
		if err := s.Delete(ctx, idemstore.DeleteParams{Key: live, Token: "tok"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, live); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("deleted record: %v", err)
		}
	})

	// The oldest hashes had neither updated_at nor the request.
	t.Run("oldest completed hash replays and lists", func(t *testing.T) {
		k := idemstore.Key{Scope: "tenant", Operation: "POST /oldest", Key: "oldest"}
		ca := time.Now().Add(-time.Minute).UnixMicro()
		if err := s.client.Do(ctx, s.client.B().Hset().Key(s.recordKey(k)).FieldValue().
			FieldValue("s", k.Scope).FieldValue("o", k.Operation).FieldValue("k", k.Key).FieldValue("fp", "fp").
			FieldValue("st", "completed").FieldValue("tok", "tok").FieldValue("lu", strconv.FormatInt(ca+1e6, 10)).
			FieldValue("ca", strconv.FormatInt(ca, 10)).FieldValue("ea", strconv.FormatInt(ca+3600e6, 10)).
			FieldValue("resp", string(idemstore.EncodeResponse(answer))).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "retry", Lease: time.Minute})
		if err != nil || created || rec.State != idemstore.StateCompleted || rec.Request != nil || rec.UpdatedAt.UnixMicro() != ca ||
			rec.Response == nil || string(rec.Response.Body) != `{"id":"ch_1"}` {
			t.Fatalf("retry of the oldest completed key: %+v, created %v, %v", rec, created, err)
		}
		page, err := s.List(ctx, idemstore.ListParams{Operation: k.Operation, Limit: 10})
		if err != nil || len(page.Records) != 1 || page.Records[0].UpdatedAt.UnixMicro() != ca || page.Records[0].Response == nil {
			t.Fatalf("List: %v, %v", page.Records, err)
		}
	})

	t.Run("a waiter is notified", func(t *testing.T) {
		k := old.reserve("waited for", "tok", time.Hour)
		ch, cancel, err := s.Subscribe(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "tok", Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: answer, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if !receive(t, ch) {
			t.Fatal("channel closed instead of notifying")
		}
	})

	// During a rolling upgrade, a new process waits for a key that a
	// process of the previous version holds: the subscription must leave
	// the hash to its holder, whose completion still lands and notifies.
	t.Run("a waiter leaves an old holder's record alone", func(t *testing.T) {
		k := old.reserve("held by an old process", "tok", time.Hour)
		ch, cancel, err := s.Subscribe(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		if typ := keyType(t, s, k); typ != "hash" {
			t.Fatalf("after Subscribe the record is a %s, want the hash its holder reads", typ)
		}
		old.complete(k, "tok", answer, time.Hour)
		if !receive(t, ch) {
			t.Fatal("channel closed instead of notifying")
		}
		rec, err := s.Get(ctx, k)
		if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != `{"id":"ch_1"}` {
			t.Fatalf("after the old holder's Complete: %+v, %v", rec, err)
		}
	})

	t.Run("a resent Complete recognises its own change", func(t *testing.T) {
		k := old.reserve("resent", "tok", time.Hour)
		r, err := newStore(s.client, s.cfg)
		if err != nil {
			t.Fatal(err)
		}
		r.callID = func() string { return resentCallID }
		twice(t, r, "Complete of an old record", idemstore.ErrLeaseLost, func() error {
			return r.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "tok", Response: answer, Retention: time.Hour})
		})
	})
}

// hasKey reports whether recs hold the record of k.
func hasKey(recs []*idemstore.Record, k idemstore.Key) bool {
	for _, r := range recs {
		if r.Key == k {
			return true
		}
	}
	return false
}
