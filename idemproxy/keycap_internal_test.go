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
		ok, _, _, full := c.admit(fmt.Sprint("scope-", i))
		if !ok {
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
	if ok, _, _, _ := c.admit("scope-4999"); ok {
		t.Error("the newest scope's second key admitted")
	}
	if ok, _, _, _ := c.admit("scope-0"); !ok {
		t.Error("the oldest scope, forgotten, was refused")
	}
	now = now.Add(time.Minute)
	if ok, _, _, _ := c.admit("scope-4999"); !ok {
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
