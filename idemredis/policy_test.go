package idemredis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// logger returns a logger writing to buf.
func logger(buf *testenv.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// quiet is a logger for engines whose logs the test does not read.
var quiet = slog.New(slog.DiscardHandler)

// answer16k is the answer of the requests that fill a server: 16 KiB.
var answer16k = &idem.Response{Status: 201, Body: bytes.Repeat([]byte("x"), 16<<10)}

// charge is the request of key name in the eviction scenarios.
func charge(name string) idem.Request {
	return idem.Request{Key: idem.Key{Scope: "tenant", Operation: "POST /charges", Key: name}, Fingerprint: "fp"}
}

// fill completes n keys of other clients, each with a 16 KiB answer, and
// returns how many the store refused as unavailable, as a full server
// under noeviction does, and how many leases were lost before their
// Complete, as when an evicting server deleted the pending record. Any
// other error fails the test.
func fill(t *testing.T, eng *idem.Engine, n int) (refused, lost int) {
	t.Helper()
	ctx := t.Context()
	for i := range n {
		res, err := eng.Begin(ctx, charge(fmt.Sprintf("other-%d", i)))
		if err == nil && res.Outcome != idem.Acquired {
			t.Fatalf("Begin(other-%d) = %v", i, res.Outcome)
		}
		completing := err == nil
		if completing {
			err = res.Lease.Complete(ctx, answer16k)
		}
		switch {
		case errors.Is(err, idemstore.ErrUnavailable):
			refused++
		case completing && errors.Is(err, context.DeadlineExceeded):
			// The server admitted the reservation but, with the answer's
			// 16 KiB in its input buffer, refused every Complete until
			// the engine's SettleTimeout ended the last attempt.
			refused++
		case errors.Is(err, idemstore.ErrLeaseLost):
			lost++
		case err != nil:
			t.Fatalf("other-%d: %v", i, err)
		}
	}
	return refused, lost
}

// evictionScenario is how records were seen to go: one key is reserved
// (and completed, unless pending), then 400 other keys are completed with
// 16 KiB answers on a server of 3 MB under policy; it returns the outcome
// of the first key's retry, and what fill returns for the others. The
// first record is made to look as old as a retry a day later finds it
// (see age).
func evictionScenario(t *testing.T, s *Store, policy string, pending bool) (retry idem.Outcome, refused, lost int) {
	t.Helper()
	// A Complete the full server refuses is retried for SettleTimeout.
	eng, err := idem.NewEngine(s, idem.EngineConfig{Logger: quiet, SettleTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	res, err := eng.Begin(ctx, charge("first"))
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Begin(first) = %v, %v", res.Outcome, err)
	}
	if !pending {
		if err := res.Lease.Complete(ctx, &idem.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	age(t, s, s.recordKey(charge("first").Key), policy)
	refused, lost = fill(t, eng, 400)
	res, err = eng.Begin(ctx, charge("first"))
	if err != nil {
		t.Fatalf("retry of first: %v", err)
	}
	return res.Outcome, refused, lost
}

// age makes key look unused for an hour (or never used, under an LFU
// policy) to the server's eviction, as a record written long before a
// retry is: the records the scenario writes next are all used within the
// same second, the resolution of Redis's LRU clock, so without it the
// eviction would choose among them and the first at random. It rewrites
// the key with DUMP and RESTORE, keeping its TTL.
func age(t *testing.T, s *Store, key, policy string) {
	t.Helper()
	ctx := t.Context()
	c := s.client
	value, err := c.Do(ctx, c.B().Dump().Key(key).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	restore := c.B().Restore().Key(key).Ttl(max(ttl, 0)).SerializedValue(value).Replace()
	var cmd rueidis.Completed
	if strings.Contains(policy, "lfu") {
		cmd = restore.Freq(0).Build()
	} else {
		cmd = restore.Idletime(3600).Build()
	}
	if err := c.Do(ctx, cmd).Error(); err != nil {
		t.Fatal(err)
	}
}

// TestEvictionPolicies runs the scenario under which Redis evicted a
// completed record (one completed key, 400 completed 16 KiB answers on a
// 3 MB server, then the retry) under every maxmemory-policy: New refuses
// every one but noeviction, under which the retry is replayed and the
// full server refuses new keys instead.
func TestEvictionPolicies(t *testing.T) {
	t.Parallel()
	for _, policy := range policies {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			c := singleClient(t, throwaway(t, "maxmemory 3mb", "maxmemory-policy "+policy), rueidis.ClientOption{})
			s, err := New(c, Config{Prefix: testPrefix()})
			if policy != safePolicy {
				if err == nil {
					retry, _, lost := evictionScenario(t, s, policy, false)
					t.Fatalf("New accepted maxmemory-policy %s; the retry of a completed key after 400 other answers was %v, and %d of them lost their lease", policy, retry, lost)
				}
				if !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), policy) {
					t.Fatalf("New under %s: %v, want ErrEvictionPolicy naming the policy", policy, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			retry, refused, lost := evictionScenario(t, s, policy, false)
			if retry != idem.Replayed || lost != 0 {
				t.Fatalf("the retry of a completed key was %v and %d leases were lost, want Replayed and none", retry, lost)
			}
			if refused == 0 {
				t.Fatal("the server never filled up: the scenario shows nothing")
			}
		})
	}
}

// TestEvictionLosesRecords is why New refuses those policies: a store that
// skipped the check (newStore) loses a completed record under volatile-lru
// and a pending one under allkeys-lru, and the retry is acquired again,
// which runs the operation twice.
func TestEvictionLosesRecords(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy  string
		pending bool
	}{{"volatile-lru", false}, {"allkeys-lru", true}} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			c := singleClient(t, throwaway(t, "maxmemory 3mb", "maxmemory-policy "+tc.policy), rueidis.ClientOption{})
			s, err := newStore(c, Config{Prefix: testPrefix()})
			if err != nil {
				t.Fatal(err)
			}
			// Other pending records may go too (their Complete then finds
			// its lease lost); the first, the oldest, goes for sure.
			if retry, refused, _ := evictionScenario(t, s, tc.policy, tc.pending); retry != idem.Acquired || refused != 0 {
				t.Fatalf("retry %v with %d refused, want Acquired with none: Redis no longer evicts as it did", retry, refused)
			}
		})
	}
}

// TestPolicyReply reads replies to CONFIG GET as servers send them: the
// replies are produced by scripts on the test server, as RESP3 maps and
// RESP2-style arrays, with names and values in any case.
func TestPolicyReply(t *testing.T) {
	t.Parallel()
	c := standaloneClient(t)
	ctx := t.Context()
	eval := func(script string) rueidis.RedisResult {
		return c.Do(ctx, c.B().Eval().Script(script).Numkeys(0).Build())
	}
	closed := newClient(t, rueidis.MustParseURL(requireEnv(t, "IDEM_TEST_REDIS_URL")))
	closed.Close()
	cases := []struct {
		name    string
		res     rueidis.RedisResult
		policy  string
		refused bool
		err     error
	}{
		{"array", eval(`return {'maxmemory-policy', 'noeviction'}`), "noeviction", false, nil},
		{"map", eval(`redis.setresp(3) return {map={['maxmemory-policy']='volatile-lru'}}`), "volatile-lru", false, nil},
		{"upper case", eval(`return {'MAXMEMORY-POLICY', 'NoEviction'}`), "noeviction", false, nil},
		{"spaces", eval(`return {'maxmemory-policy', ' allkeys-lru '}`), "allkeys-lru", false, nil},
		{"other names", eval(`return {'maxmemory', '0', 'maxmemory-policy', 'volatile-ttl'}`), "volatile-ttl", false, nil},
		{"twice", eval(`return {'maxmemory-policy', 'noeviction', 'MAXMEMORY-POLICY', 'noeviction'}`), "noeviction", false, nil},
		{"twice, differently", eval(`return {'maxmemory-policy', 'noeviction', 'MAXMEMORY-POLICY', 'allkeys-lru'}`), "", true, nil},
		{"empty", eval(`return {}`), "", true, nil},
		{"no policy", eval(`return {'maxmemory', '0'}`), "", true, nil},
		{"empty policy", eval(`return {'maxmemory-policy', ''}`), "", true, nil},
		{"odd length", eval(`return {'maxmemory-policy'}`), "", true, nil},
		{"not a map", eval(`return 'noeviction'`), "", true, nil},
		{"renamed", eval(`return redis.error_reply("ERR unknown command 'CONFIG', with args beginning with: 'GET' 'maxmemory-policy'")`), "", true, nil},
		{"not permitted", eval(`return redis.error_reply("NOPERM User idem has no permissions to run the 'config|get' command")`), "", true, nil},
		{"loading", eval(`return redis.error_reply('LOADING Redis is loading the dataset in memory')`), "", false, idemstore.ErrUnavailable},
		{"cluster down", eval(`return redis.error_reply('CLUSTERDOWN The cluster is down')`), "", false, idemstore.ErrUnavailable},
		{"closed client", closed.Do(ctx, closed.B().ConfigGet().Parameter("maxmemory-policy").Build()), "", false, idemstore.ErrUnavailable},
	}
	for _, tc := range cases {
		policy, refused, err := policyReply(ctx, tc.res)
		if policy != tc.policy || (refused != nil) != tc.refused || !errors.Is(err, tc.err) || (err != nil) != (tc.err != nil) {
			t.Errorf("%s: policy %q, refused %v, err %v; want %q, refused %v, err %v", tc.name, policy, refused, err, tc.policy, tc.refused, tc.err)
		}
	}
}

// TestPolicyConfigRefused covers servers that do not tell their policy:
// CONFIG renamed away, and an ACL user that may not run it. New then
// needs Config.MaxmemoryPolicy, refuses it unless it is noeviction, and
// warns that it could not verify it.
func TestPolicyConfigRefused(t *testing.T) {
	t.Parallel()
	servers := []struct {
		name   string
		conf   []string
		option rueidis.ClientOption
	}{
		{"renamed", []string{`rename-command CONFIG ""`}, rueidis.ClientOption{}},
		{"not permitted", []string{"user default off", "user idem on >secret ~* &* +@all -config"}, rueidis.ClientOption{Username: "idem", Password: "secret"}},
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			c := singleClient(t, throwaway(t, append(srv.conf, "maxmemory-policy noeviction")...), srv.option)
			if _, err := New(c, Config{}); !errors.Is(err, ErrPolicyUnknown) || !strings.Contains(err.Error(), "MaxmemoryPolicy") {
				t.Fatalf("New without MaxmemoryPolicy: %v, want ErrPolicyUnknown naming the setting", err)
			}
			for _, stated := range []string{"volatile-lru", "allkeys-random"} {
				if _, err := New(c, Config{MaxmemoryPolicy: stated}); !errors.Is(err, ErrEvictionPolicy) {
					t.Fatalf("New with MaxmemoryPolicy %s: %v, want ErrEvictionPolicy", stated, err)
				}
			}
			var logs testenv.Buffer
			s, err := New(c, Config{MaxmemoryPolicy: " NoEviction", Logger: logger(&logs)})
			if err != nil {
				t.Fatal(err)
			}
			if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "could not be verified") || !strings.Contains(out, "maxmemory_policy=noeviction") {
				t.Fatalf("no warning that the policy was not verified: %q", out)
			}
			// Later checks take the stated policy too, without refusing.
			if err := s.CheckPolicy(t.Context()); err != nil {
				t.Fatal(err)
			}
			reserve(t, s, "k", "tok", 0)
		})
	}
}

// TestPolicyStatedAndTold: where CONFIG GET answers, the node's policy
// counts, whatever Config.MaxmemoryPolicy says, and a difference is logged.
func TestPolicyStatedAndTold(t *testing.T) {
	t.Parallel()
	c := singleClient(t, throwaway(t, "maxmemory-policy allkeys-lru"), rueidis.ClientOption{})
	if _, err := New(c, Config{MaxmemoryPolicy: "noeviction"}); !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lru (by CONFIG GET)") {
		t.Fatalf("New stating noeviction on an allkeys-lru server: %v, want ErrEvictionPolicy by CONFIG GET", err)
	}
	configSet(t, c, "maxmemory-policy", "noeviction")
	var logs testenv.Buffer
	if _, err := New(c, Config{MaxmemoryPolicy: "volatile-lru", Logger: logger(&logs)}); err != nil {
		t.Fatalf("New stating volatile-lru on a noeviction server: %v", err)
	}
	if out := logs.String(); !strings.Contains(out, "differs") || !strings.Contains(out, "reported=noeviction") {
		t.Fatalf("no warning that the stated policy differs: %q", out)
	}
}

// TestPolicyAtRunTime changes the policy of a running server under a
// store: from the next check (ListExpiredLeases, Purge or CheckPolicy) the
// store refuses reservations, the middleware answers 503 without running
// the handler, and the refusal lifts when the policy is noeviction again.
// Each change is logged once. maxmemory is 0 throughout: the policy counts
// whatever the limit.
func TestPolicyAtRunTime(t *testing.T) {
	t.Parallel()
	c := singleClient(t, throwaway(t), rueidis.ClientOption{})
	ctx := t.Context()
	var logs testenv.Buffer
	s, err := New(c, Config{Prefix: testPrefix(), Logger: logger(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	configSet(t, c, "maxmemory-policy", "allkeys-lru")
	if _, err := New(c, Config{}); !errors.Is(err, ErrEvictionPolicy) {
		t.Fatalf("New with maxmemory 0 and allkeys-lru: %v, want ErrEvictionPolicy", err)
	}
	// Until a check runs, the store does not know.
	reserve(t, s, "before the check", "tok-0", 0)

	if _, err := s.ListExpiredLeases(ctx, 10); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Reserve(ctx, idemstore.ReserveParams{Key: charge("refused").Key, Fingerprint: "fp", Token: "tok-1", Lease: 1})
	if !errors.Is(err, idemstore.ErrUnavailable) || !errors.Is(err, ErrEvictionPolicy) {
		t.Fatalf("Reserve after the check: %v, want ErrUnavailable and ErrEvictionPolicy", err)
	}
	err = s.Takeover(ctx, idemstore.TakeoverParams{Key: charge("before the check").Key, OldToken: "tok-0", NewToken: "tok-2", Lease: 1})
	if !errors.Is(err, idemstore.ErrUnavailable) || !errors.Is(err, ErrEvictionPolicy) {
		t.Fatalf("Takeover after the check: %v, want ErrUnavailable and ErrEvictionPolicy", err)
	}
	if _, err := s.Get(ctx, charge("before the check").Key); err != nil {
		t.Fatalf("Get while reservations are refused: %v", err)
	}

	eng, err := idem.NewEngine(s, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runs := newRunCounter()
	h := idem.Middleware(eng, idem.Config{Scope: idem.GlobalScope})(runs.handler(nil))
	if rec := post(h, "refused"); rec.Code != 503 || !strings.Contains(rec.Body.String(), idem.ProblemUnavailable) || runs.total() != 0 {
		t.Fatalf("POST while reservations are refused: %d %s, handler ran %d times", rec.Code, rec.Body, runs.total())
	}

	// A check that cannot reach the server changes nothing.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.CheckPolicy(cancelled); errors.Is(err, ErrEvictionPolicy) || err == nil {
		t.Fatalf("CheckPolicy with a cancelled ctx: %v", err)
	}
	if _, err := s.Purge(ctx, idemstore.PurgeParams{}); err != nil {
		t.Fatal(err)
	}
	if err := s.admit(); !errors.Is(err, ErrEvictionPolicy) {
		t.Fatalf("after a check that failed and one that found the same, admit = %v", err)
	}

	configSet(t, c, "maxmemory-policy", "noeviction")
	if _, err := s.Purge(ctx, idemstore.PurgeParams{}); err != nil {
		t.Fatal(err)
	}
	if rec := post(h, "resumed"); rec.Code != 201 || runs.total() != 1 {
		t.Fatalf("POST once the policy is noeviction again: %d %s, handler ran %d times", rec.Code, rec.Body, runs.total())
	}
	out := logs.String()
	if strings.Count(out, "level=ERROR") != 1 || strings.Count(out, "reservations resume") != 1 {
		t.Fatalf("want one ERROR when reservations stop and one INFO when they resume:\n%s", out)
	}
}
