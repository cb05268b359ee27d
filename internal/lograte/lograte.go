// Package lograte keeps a line that could repeat on every request from
// flooding a log: at most one line per kind every interval, with the number
// of lines left out since the last one.
package lograte

import (
	"sync"
	"time"
)

// Limiter lets through one line per kind every Every. Kinds must come from
// a small fixed set (messages, routes): each is remembered. The zero value
// lets every line through.
type Limiter struct {
	// Every is the shortest time between two lines of one kind.
	Every time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time

	mu   sync.Mutex
	seen map[string]*kind
}

type kind struct {
	last    time.Time
	leftOut int
}

// Allow reports whether a line of kind may be written now, and if so how
// many lines of that kind were left out since the last one written.
func (l *Limiter) Allow(k string) (ok bool, leftOut int) {
	if l.Every <= 0 {
		return true, 0
	}
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	t := now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = make(map[string]*kind)
	}
	s := l.seen[k]
	if s == nil {
		s = &kind{}
		l.seen[k] = s
	}
	if !s.last.IsZero() && t.Sub(s.last) < l.Every {
		s.leftOut++
		return false, 0
	}
	leftOut = s.leftOut
	s.last, s.leftOut = t, 0
	return true, leftOut
}
