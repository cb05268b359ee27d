package idemredis

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	s, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Config{Prefix: "p"})
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

func TestConfig(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	s, err := New(client, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Prefix != "idem" || s.cfg.RetentionGrace != time.Hour || s.cfg.ScanCount != 500 || s.cfg.ClassicPubSub {
		t.Errorf("defaults = %+v", s.cfg)
	}
	if s.match != `idem:{*}:r` {
		t.Errorf("match = %q", s.match)
	}
	s, err = New(client, Config{Prefix: `a*b[c]`})
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
	} {
		if _, err := New(client, bad); err == nil {
			t.Errorf("New(%+v) accepted", bad)
		}
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New(nil) accepted")
	}
	replicaReads := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ReadOnly: true})
	defer replicaReads.Close()
	if _, err := New(replicaReads, Config{}); err == nil {
		t.Error("New(ClusterClient with ReadOnly) accepted")
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	if _, err := New(ring, Config{}); err == nil {
		t.Error("New(*redis.Ring) accepted")
	}
}

func TestTTL(t *testing.T) {
	t.Parallel()
	s, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Config{RetentionGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	cases := []struct {
		expires time.Time
		want    int64
	}{
		{now.Add(24 * time.Hour), (24*time.Hour + time.Minute).Milliseconds()},
		{now.Add(1500 * time.Microsecond), time.Minute.Milliseconds() + 2}, // rounded up
		{now, time.Minute.Milliseconds()},
		{now.Add(-time.Hour), time.Minute.Milliseconds()}, // already expired: grace only
	}
	for _, c := range cases {
		if got := s.ttlMillis(now, c.expires); got != c.want {
			t.Errorf("ttlMillis(expires %v) = %d, want %d", c.expires.Sub(now), got, c.want)
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

// TestResentScripts runs Reserve and Takeover twice with the same
// arguments, as go-redis does when a connection breaks after the script ran
// but before its reply arrived: the second run must report the first run's
// success, not a conflict.
func TestResentScripts(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t, 0))
	ctx := t.Context()
	now := time.Now().UTC()
	k := idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: "resent"}
	p := idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "tok-1", LeaseUntil: now.Add(time.Minute), Now: now}
	for i := range 2 {
		rec, created, err := s.Reserve(ctx, p)
		if err != nil || !created || rec != nil {
			t.Fatalf("Reserve run %d: created %v, record %+v, %v; want created", i+1, created, rec, err)
		}
	}
	// Another caller with another token still sees a conflict, and so does
	// one that reuses the token for another request.
	for _, other := range []idemstore.ReserveParams{
		{Key: k, Fingerprint: "fp", Token: "tok-2", LeaseUntil: now.Add(time.Minute), Now: now},
		{Key: k, Fingerprint: "other", Token: "tok-1", LeaseUntil: now.Add(time.Minute), Now: now},
	} {
		if rec, created, err := s.Reserve(ctx, other); err != nil || created || rec.Token != "tok-1" {
			t.Fatalf("Reserve(%q, %q) = created %v, %+v, %v; want the existing record", other.Token, other.Fingerprint, created, rec, err)
		}
	}

	tp := idemstore.TakeoverParams{Key: k, OldToken: "tok-1", NewToken: "tok-3", LeaseUntil: now.Add(3 * time.Minute), Now: now.Add(2 * time.Minute)}
	for i := range 2 {
		if err := s.Takeover(ctx, tp); err != nil {
			t.Fatalf("Takeover run %d: %v", i+1, err)
		}
	}
	tp.NewToken = "tok-4"
	if err := s.Takeover(ctx, tp); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Takeover with the old token after it was taken over: %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, k); err != nil || rec.Token != "tok-3" {
		t.Fatalf("Get = %+v, %v; want token tok-3", rec, err)
	}
}
