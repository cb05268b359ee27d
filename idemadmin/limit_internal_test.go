package idemadmin

import (
	"fmt"
	"testing"
	"time"
)

// TestSignInLimiterBounded: however many networks fail, the limiter keeps
// at most maxLimitedAddrs of them, forgets the least recently failed one
// first, and forgets an address as soon as it has every try back; an
// address that only signs in is never kept.
func TestSignInLimiterBounded(t *testing.T) {
	t.Parallel()
	l := newSignInLimiter(3, time.Minute)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 100 {
		if ok, _, _ := l.allow(fmt.Sprintf("192.0.2.%d", i), now); !ok {
			t.Fatal("a fresh address refused")
		}
	}
	if n := l.tracked(); n != 0 {
		t.Fatalf("%d addresses kept after sign-ins without a failure", n)
	}
	for i := range 2 * maxLimitedAddrs {
		l.fail(fmt.Sprintf("2001:db8:%x:%x::/64", i>>16, i&0xffff), now)
		if n := l.tracked(); n > maxLimitedAddrs {
			t.Fatalf("%d addresses kept after %d failed", n, i+1)
		}
	}
	if n := l.tracked(); n != maxLimitedAddrs {
		t.Errorf("%d addresses kept, want %d", n, maxLimitedAddrs)
	}
	// The oldest half was forgotten; the newest half is still counted.
	if left := l.fail("2001:db8:0:0::/64", now); left != 2 {
		t.Errorf("the first network to fail, forgotten, has %d tries left, want 2", left)
	}
	last := fmt.Sprintf("2001:db8:%x:%x::/64", (2*maxLimitedAddrs-1)>>16, (2*maxLimitedAddrs-1)&0xffff)
	if left := l.fail(last, now); left != 1 {
		t.Errorf("the last network to fail has %d tries left, want 1", left)
	}
	// Three minutes on, every address has its tries back, and is
	// forgotten when next seen.
	later := now.Add(3 * time.Minute)
	if ok, _, _ := l.allow(last, later); !ok {
		t.Error("the last network is still refused")
	}
	if n := l.tracked(); n != maxLimitedAddrs-1 {
		t.Errorf("%d addresses kept, want %d", n, maxLimitedAddrs-1)
	}
}

// TestSignInLimiterRefusedStaysCounted: an address refused while it keeps
// trying is the most recent, so failures from other addresses push out
// those that stopped first.
func TestSignInLimiterRefusedStaysCounted(t *testing.T) {
	t.Parallel()
	l := newSignInLimiter(1, time.Minute)
	l.max = 3
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l.fail("a", now)
	l.fail("b", now)
	l.fail("c", now)
	if ok, _, _ := l.allow("a", now); ok {
		t.Fatal("a is not refused")
	}
	l.fail("d", now) // pushes out b, the least recent
	if ok, _, _ := l.allow("a", now); ok {
		t.Error("a, refused a moment ago, was forgotten")
	}
	if ok, _, _ := l.allow("b", now); !ok {
		t.Error("b is still counted")
	}
}
