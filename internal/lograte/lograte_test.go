package lograte

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := &Limiter{Every: 10 * time.Second, Now: func() time.Time { return now }}
	steps := []struct {
		advance time.Duration
		kind    string
		ok      bool
		leftOut int
	}{
		{0, "a", true, 0},
		{time.Second, "a", false, 0},
		{time.Second, "a", false, 0},
		{0, "b", true, 0}, // kinds are apart
		{8 * time.Second, "a", true, 2},
		{10 * time.Second, "a", true, 0},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		ok, n := l.Allow(s.kind)
		if ok != s.ok || n != s.leftOut {
			t.Errorf("step %d: Allow(%q) = %v, %d; want %v, %d", i, s.kind, ok, n, s.ok, s.leftOut)
		}
	}
	var zero Limiter
	for range 3 {
		if ok, _ := zero.Allow("x"); !ok {
			t.Fatal("the zero Limiter held a line back")
		}
	}
}
