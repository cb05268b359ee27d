package idemredis

import (
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
