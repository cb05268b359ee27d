package idemredis

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

func TestHashTagIsCollisionFreeAndSafe(t *testing.T) {
	t.Parallel()
	// Pairs that a naive "scope|op|key" tag would confuse, and strings that
	// would break or move a Redis hash tag.
	keys := []idemstore.Key{
		{Scope: "a|b", Operation: "c", Key: "d"},
		{Scope: "a", Operation: "b|c", Key: "d"},
		{Scope: "a", Operation: "b", Key: "c|d"},
		{Scope: "a", Operation: "", Key: "bcd"},
		{Scope: "", Operation: "a", Key: "bcd"},
		{Scope: "ab", Operation: "", Key: "cd"},
		{Scope: "t", Operation: "POST /x", Key: "}"},
		{Scope: "t", Operation: "POST /x", Key: "{"},
		{Scope: "t", Operation: "POST /x", Key: "{}"},
		{Scope: "t}", Operation: "{POST /x", Key: "k"},
		{Scope: "\x00", Operation: "", Key: ""},
		{Scope: "", Operation: "\x00", Key: ""},
		{},
	}
	s, err := newStore(unusedClient, Config{Prefix: "p"})
	if err != nil {
		t.Fatal(err)
	}
	shape := regexp.MustCompile(`^p:\{[0-9a-f]{64}\}:r$`)
	seen := map[string]idemstore.Key{}
	for _, k := range keys {
		rk := s.recordKey(k)
		if !shape.MatchString(rk) {
			t.Errorf("recordKey(%q) = %q, want p:{<64 hex>}:r", k, rk)
		}
		if other, dup := seen[rk]; dup {
			t.Errorf("keys %q and %q share %s", k, other, rk)
		}
		seen[rk] = k
		if tag := strings.TrimSuffix(rk, ":r"); !strings.HasPrefix(s.channel(k), tag+":") {
			t.Errorf("channel %s does not share the tag of %s", s.channel(k), rk)
		}
	}
}

// unusedClient stands for a client in tests of what newStore (New without
// its policy check) and the key functions do without a server; calling it
// panics.
var unusedClient rueidis.Client = unused{}

// unused is a client that is never called but for its Mode, which New
// reads to lay out the search indexes.
type unused struct{ rueidis.Client }

func (unused) Mode() rueidis.ClientMode { return rueidis.ClientModeStandalone }

func TestConfig(t *testing.T) {
	t.Parallel()
	client := unusedClient
	s, err := newStore(client, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Prefix != "idem" || s.cfg.RetentionGrace != time.Hour || s.cfg.ScanCount != 500 || s.cfg.ClassicPubSub || s.cfg.Resends != 3 {
		t.Errorf("defaults = %+v", s.cfg)
	}
	if s.match != `idem:{*}:r` {
		t.Errorf("match = %q", s.match)
	}
	s, err = newStore(client, Config{Prefix: `a*b[c]`})
	if err != nil {
		t.Fatal(err)
	}
	if s.match != `a\*b\[c\]:{*}:r` {
		t.Errorf("match for a glob-like prefix = %q", s.match)
	}
	for _, bad := range []Config{
		{Prefix: "a{b"},
		{Prefix: "a}b"},
		{RetentionGrace: -time.Second},
		{ScanCount: -1},
		{Resends: -2},
	} {
		if _, err := newStore(client, bad); err == nil {
			t.Errorf("newStore(%+v) accepted", bad)
		}
	}
	if _, err := newStore(nil, Config{}); err == nil {
		t.Error("newStore(nil) accepted")
	}
	if s, err := newStore(client, Config{Resends: -1}); err != nil || s.cfg.Resends != -1 {
		t.Errorf("newStore(Resends: -1) = %+v, %v", s, err)
	}
}

func TestTTL(t *testing.T) {
	t.Parallel()
	s, err := newStore(unusedClient, Config{RetentionGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		retention time.Duration
		want      int64
	}{
		{24 * time.Hour, (24*time.Hour + time.Minute).Milliseconds()},
		{1500 * time.Microsecond, time.Minute.Milliseconds() + 2}, // rounded up
		{0, time.Minute.Milliseconds()},
		{-time.Hour, time.Minute.Milliseconds()}, // already purgeable: grace only
	}
	for _, c := range cases {
		if got := s.ttlMillis(c.retention); got != strconv.FormatInt(c.want, 10) {
			t.Errorf("ttlMillis(%v) = %s, want %d", c.retention, got, c.want)
		}
	}
}

func TestDurMicros(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		time.Second:             "1000000",
		time.Nanosecond:         "1", // a positive lease has not expired when granted
		1500 * time.Nanosecond:  "2",
		0:                       "0",
		-time.Nanosecond:        "0", // expired: the deadline is now
		-1500 * time.Nanosecond: "-1",
		-time.Hour:              "-3600000000",
	} {
		if got := durMicros(d); got != want {
			t.Errorf("durMicros(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestTimesRoundTripAtMicroseconds(t *testing.T) {
	t.Parallel()
	in := time.Date(2030, 12, 31, 23, 59, 59, 123456789, time.FixedZone("x", 3600))
	got, err := parseMicros(micros(in))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(in.Truncate(time.Microsecond)) || got.Location() != time.UTC {
		t.Errorf("round trip of %v = %v", in, got)
	}
	if micros(time.Time{}) != "" {
		t.Error("zero time not encoded as empty")
	}
	if z, err := parseMicros(""); err != nil || !z.IsZero() {
		t.Errorf(`parseMicros("") = %v, %v`, z, err)
	}
}

func TestPositionRoundTrip(t *testing.T) {
	t.Parallel()
	for _, p := range []position{{}, {node: 2, cursor: 1 << 60, key: "p:{ab}:r"}, {node: 0, cursor: 7, key: "a:b:c"}} {
		got, err := decodePosition(p.encode())
		if err != nil || got != p {
			t.Errorf("decode(encode(%+v)) = %+v, %v", p, got, err)
		}
	}
	for _, bad := range []string{"%%%", "bm9jb2xvbnM", "LTE6MDp4"} { // "nocolons", "-1:0:x"
		if _, err := decodePosition(bad); err == nil {
			t.Errorf("decodePosition(%q) accepted", bad)
		}
	}
}

// TestTimesAreTheServers checks that every deadline and time comes from
// the server's TIME: each lies between the server's TIME read before and
// after the call that set it, wherever the test's own clock is.
func TestTimesAreTheServers(t *testing.T) {
	t.Parallel()
	client := standaloneClient(t)
	s := newTestStore(t, client)
	ctx := t.Context()
	serverNow := func() time.Time {
		t.Helper()
		now, err := serverTime(client.Do(ctx, client.B().Time().Build()))
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
	within := func(what string, got, before, after time.Time, offset time.Duration) {
		t.Helper()
		if got.Before(before.Add(offset)) || got.After(after.Add(offset)) {
			t.Errorf("%s = %v, want between %v and %v", what, got, before.Add(offset), after.Add(offset))
		}
	}
	k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: "clock"}

	before := serverNow()
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "t1", Lease: time.Hour}); err != nil || !created {
		t.Fatalf("Reserve: created %v, %v", created, err)
	}
	after := serverNow()
	rec, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	got := serverNow()
	within("CreatedAt", rec.CreatedAt, before, after, 0)
	within("LeaseUntil", rec.LeaseUntil, before, after, time.Hour)
	if !rec.UpdatedAt.Equal(rec.CreatedAt) {
		t.Errorf("UpdatedAt %v, want CreatedAt %v", rec.UpdatedAt, rec.CreatedAt)
	}
	within("ReadAt", rec.ReadAt, after, got, 0)

	before = serverNow()
	if err := s.Extend(ctx, idemstore.ExtendParams{Key: k, Token: "t1", Lease: -time.Minute}); err != nil {
		t.Fatal(err)
	}
	after = serverNow()
	rec, _ = s.Get(ctx, k)
	within("extended LeaseUntil", rec.LeaseUntil, before, after, -time.Minute)
	within("UpdatedAt after Extend", rec.UpdatedAt, before, after, 0)

	before = serverNow()
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t1", Response: &idemstore.Response{Status: 200}, Retention: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	after = serverNow()
	rec, _ = s.Get(ctx, k)
	within("ExpiresAt", rec.ExpiresAt, before, after, 2*time.Hour)
	within("UpdatedAt after Complete", rec.UpdatedAt, before, after, 0)
	ms, err := client.Do(ctx, client.B().Pttl().Key(s.recordKey(k)).Build()).AsInt64()
	if ttl := time.Duration(ms) * time.Millisecond; err != nil || ttl <= 2*time.Hour || ttl > 2*time.Hour+s.cfg.RetentionGrace {
		t.Errorf("PTTL after Complete = %dms, %v; want retention + grace", ms, err)
	}
}

// TestRecordsWithoutNewFields reads a record as an earlier version of the
// store wrote it, without updated_at and request: UpdatedAt is CreatedAt and
// Request is nil, and the record can still be completed.
func TestRecordsWithoutNewFields(t *testing.T) {
	t.Parallel()
	client := standaloneClient(t)
	s := newTestStore(t, client)
	ctx := t.Context()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: "old"}
	hset := client.B().Hset().Key(s.recordKey(k)).FieldValue().FieldValue("s", k.Scope).FieldValue("o", k.Operation).
		FieldValue("k", k.Key).FieldValue("fp", "fp").FieldValue("st", "pending").FieldValue("tok", "t1").
		FieldValue("lu", "4102444800000000").FieldValue("ca", "1700000000123456").Build()
	if err := client.Do(ctx, hset).Error(); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	created := time.UnixMicro(1700000000123456).UTC()
	if !rec.CreatedAt.Equal(created) || !rec.UpdatedAt.Equal(created) || rec.Request != nil || rec.ReadAt.IsZero() {
		t.Fatalf("old record read as %+v", rec)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: "t1", Response: &idemstore.Response{Status: 204}, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if rec, err = s.Get(ctx, k); err != nil || rec.State != idemstore.StateCompleted || !rec.UpdatedAt.After(created) {
		t.Fatalf("after Complete: %+v, %v", rec, err)
	}
}
