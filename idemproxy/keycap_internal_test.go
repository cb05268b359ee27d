package idemproxy

import (
	"fmt"
	"testing"
	"time"
)

// TestKeyCapBounded: the cap counts at most max scopes, forgets a scope
// whose interval ended, and makes room by forgetting the scope whose
// interval started longest ago, once reporting that it is full.
func TestKeyCapBounded(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newKeyCap(NewKeyLimit{Limit: 1, Interval: Duration(time.Minute)}, func() time.Time { return now })
	c.max = 1000
	fulls := 0
	for i := range 5000 {
		w, _, _, full := c.admit(fmt.Sprint("scope-", i))
		if w == nil {
			t.Fatalf("scope %d's first key refused", i)
		}
		if full {
			fulls++
		}
		if n := c.scopes(); n > c.max {
			t.Fatalf("%d scopes counted after %d", n, i+1)
		}
	}
	if fulls != 1 {
		t.Errorf("full reported %d times, want once", fulls)
	}
	if w, _, _, _ := c.admit("scope-4999"); w != nil {
		t.Error("the newest scope's second key admitted")
	}
	if w, _, _, _ := c.admit("scope-0"); w == nil {
		t.Error("the oldest scope, forgotten, was refused")
	}
	now = now.Add(time.Minute)
	if w, _, _, _ := c.admit("scope-4999"); w == nil {
		t.Error("a key in the next interval refused")
	}
	if n := c.scopes(); n != 1 {
		t.Errorf("%d scopes counted after every interval ended, want 1", n)
	}
}

// TestKeyCapFullScale: at MaxCappedScopes, the table stays within its
// bound with the real limit.
func TestKeyCapFullScale(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newKeyCap(NewKeyLimit{Limit: 10}, func() time.Time { return now })
	for i := range MaxCappedScopes + 1000 {
		c.admit(fmt.Sprint("scope-", i))
	}
	if n := c.scopes(); n != MaxCappedScopes {
		t.Errorf("%d scopes counted, want %d", n, MaxCappedScopes)
	}
}

// TestKeyCapRefund: a refund gives a key back to the window it was counted
// in, and only to it: once that window ended, the next one owes nothing.
func TestKeyCapRefund(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newKeyCap(NewKeyLimit{Limit: 1, Interval: Duration(time.Minute)}, func() time.Time { return now })
	w, _, _, _ := c.admit("a")
	c.refund(w)
	c.refund(w) // twice: never below nothing
	w, _, _, _ = c.admit("a")
	if w == nil {
		t.Fatal("a key refunded was not given back")
	}
	if again, _, _, _ := c.admit("a"); again != nil {
		t.Fatal("a second refund of one key let two more in")
	}
	now = now.Add(time.Minute)
	next, _, _, _ := c.admit("a")
	if next == nil {
		t.Fatal("the next interval's first key refused")
	}
	c.refund(w) // of the interval that ended
	if extra, _, _, _ := c.admit("a"); extra != nil {
		t.Fatal("a refund from an ended interval let a key into the next")
	}
}
