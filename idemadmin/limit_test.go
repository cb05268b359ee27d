package idemadmin_test

import (
	"fmt"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemadmin"
)

// signInFrom is one API request with token from remote (host:port), on
// f's handler, and its status.
func (f *fixture) signInFrom(remote, token string, xff ...string) int {
	r := httptest.NewRequest("GET", "/api/v1/keys", nil)
	r.RemoteAddr = remote
	r.Header.Set("Authorization", "Bearer "+token)
	if len(xff) > 0 {
		r.Header.Set("X-Forwarded-For", strings.Join(xff, ", "))
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w.Code
}

// limitClock is a settable clock for the sign-in limiter.
func limitClock(c *idemadmin.Config) *atomic.Int64 {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	c.Now = func() time.Time { return time.Unix(0, now.Load()) }
	return &now
}

// TestSignInIPv6Networks: failed sign-ins from IPv6 addresses count by
// their network (a /64 by default, or SignInIPv6Prefix bits): a host that
// picks a new address of its network for every try shares one count,
// while the next network does not; an IPv4-mapped IPv6 address counts as
// the IPv4 address, behind a load balancer too.
func TestSignInIPv6Networks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		bits        int    // 0: the default
		same, other string // an address of the attacker's network, of another
		sameStatus  int    // what same gets
	}{
		{0, "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1", "[2001:db8:1:3::1]:1", 429},
		{64, "[2001:db8:1:2:abcd::9]:1", "[2001:db8:1:1::1]:1", 429},
		{56, "[2001:db8:1:ff::1]:1", "[2001:db8:1:100::1]:1", 429},
		{48, "[2001:db8:1:ffff::1]:1", "[2001:db8:2::1]:1", 429},
		// Each address alone: ::3 failed once, and has tries left.
		{128, "[2001:db8:1:2::3]:1", "[2001:db8:1:2::4]:1", 200},
	} {
		t.Run(fmt.Sprint(tc.bits), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, func(c *idemadmin.Config) {
				limitClock(c)
				c.SignInFailures, c.SignInIPv6Prefix = 3, tc.bits
			})
			// Three wrong tokens, each from another address of 2001:db8:1:2::/64.
			for i := range 3 {
				if got := f.signInFrom(fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1), "wrong-token"); got != 401 {
					t.Fatalf("wrong token %d: %d", i, got)
				}
			}
			if got := f.signInFrom(tc.same, opsToken); got != tc.sameStatus {
				t.Errorf("the right token from %s, in the network that failed 3 times: %d, want %d", tc.same, got, tc.sameStatus)
			}
			if got := f.signInFrom(tc.other, opsToken); got != 200 {
				t.Errorf("the right token from %s, in another network: %d, want 200", tc.other, got)
			}
		})
	}
	t.Run("mapped", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, func(c *idemadmin.Config) {
			limitClock(c)
			c.SignInFailures = 2
			c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		})
		f.signInFrom("[::ffff:192.0.2.9]:1", "wrong-token")
		f.signInFrom("10.0.0.1:1", "wrong-token", "::ffff:192.0.2.9")
		for _, remote := range []string{"192.0.2.9:2", "[::ffff:192.0.2.9]:3"} {
			if got := f.signInFrom(remote, opsToken); got != 429 {
				t.Errorf("the right token from %s after 2 failures of 192.0.2.9: %d, want 429", remote, got)
			}
		}
		if got := f.signInFrom("[::ffff:192.0.2.10]:1", opsToken); got != 200 {
			t.Errorf("the next IPv4 address: %d, want 200", got)
		}
	})
}

// TestSignInIPv6PrefixChecked: a prefix length that would lump whole
// providers together, or is not one, stops the handler at start.
func TestSignInIPv6PrefixChecked(t *testing.T) {
	t.Parallel()
	for _, bits := range []int{-1, 8, 31, 129} {
		_, err := idemadmin.New(idemadmin.Config{Store: newFixture(t).store, Tokens: map[string]string{"ops": opsToken}, SignInIPv6Prefix: bits})
		if err == nil || !strings.Contains(err.Error(), "SignInIPv6Prefix") {
			t.Errorf("SignInIPv6Prefix %d: %v", bits, err)
		}
	}
}

// TestSignInManyAttackers: an attacker failing from 20 000 IPv6 networks,
// more than the limiter tracks, locks out its own networks but never an
// address that did not fail, whether it arrives during the attack or
// after; an operator at an address that failed once still has its tries
// left. The networks still locked out stay refused while they keep trying.
func TestSignInManyAttackers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *idemadmin.Config) {
		limitClock(c)
		c.SignInFailures = 2
	})
	attacker := func(i int) string { return fmt.Sprintf("[2001:db8:%x:%x::1]:1", i>>16, i&0xffff) }
	if got := f.signInFrom("198.51.100.7:1", "a-typo"); got != 401 {
		t.Fatalf("the operator's typo: %d", got)
	}
	for i := range 20000 {
		for range 2 {
			if got := f.signInFrom(attacker(i), "guess"); got != 401 {
				t.Fatalf("attacker %d: %d", i, got)
			}
		}
		if i%5000 == 0 {
			if got := f.signInFrom(fmt.Sprintf("[2001:db8:ffff:%x::1]:1", i), opsToken); got != 200 {
				t.Fatalf("a fresh network during the attack (after %d attacker networks): %d, want 200", i, got)
			}
		}
	}
	for _, fresh := range []string{"203.0.113.5:1", "[2001:db8:ffff:ffff::1]:1", "[::ffff:203.0.113.6]:1"} {
		if got := f.signInFrom(fresh, opsToken); got != 200 {
			t.Errorf("a fresh address %s after 20 000 attacker networks failed: %d, want 200", fresh, got)
		}
	}
	if got := f.signInFrom("198.51.100.7:1", opsToken); got != 200 {
		t.Errorf("the operator whose one typo was forgotten under the attack: %d, want 200", got)
	}
	if got := f.signInFrom(attacker(19999), opsToken); got != 429 {
		t.Errorf("the last attacker network, locked out: %d, want 429", got)
	}
}

// TestSignInLimiterConcurrent: failures and sign-ins from many goroutines
// and addresses at once keep the counts consistent (run with -race).
func TestSignInLimiterConcurrent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *idemadmin.Config) {
		limitClock(c)
		c.SignInFailures = 3
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				f.signInFrom(fmt.Sprintf("[2001:db8:%x:%x::1]:1", g, i%50), "guess")
			}
		})
	}
	wg.Wait()
	for g := range 8 {
		if got := f.signInFrom(fmt.Sprintf("[2001:db8:%x:7::2]:1", g), opsToken); got != 429 {
			t.Errorf("network %d:7, which failed 4 times: %d, want 429", g, got)
		}
	}
	if got := f.signInFrom("[2001:db8:9::1]:1", opsToken); got != 200 {
		t.Errorf("a fresh network: %d", got)
	}
}
