package idemadmin

import (
	"sync"
	"time"
)

// recentActions is how many admin actions the overview shows.
const recentActions = 20

// Action is one change an operator made, as the overview lists it.
type Action struct {
	// At is when it was made, by this server's clock.
	At time.Time `json:"at"`
	// By names the admin token that made it.
	By string `json:"by"`
	// Action is release, complete or delete.
	Action    string `json:"action"`
	ID        string `json:"id"`
	Key       string `json:"key"`
	Operation string `json:"operation"`
	Note      string `json:"note,omitempty"`
}

// actionLog keeps the latest admin actions made through this process, in
// memory: the overview's "recent actions". Each instance of a fleet shows
// its own; the audit log (every instance's "admin: key resolved" and
// "admin: key deleted" lines) has them all.
type actionLog struct {
	mu   sync.Mutex
	ring []Action
	next int
	full bool
}

func newActionLog(n int) *actionLog { return &actionLog{ring: make([]Action, n)} }

func (l *actionLog) add(r Result, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.next] = Action{At: at.UTC(), By: r.By, Action: r.Action, ID: r.ID, Key: r.Key, Operation: r.Operation, Note: r.Note}
	l.next = (l.next + 1) % len(l.ring)
	l.full = l.full || l.next == 0
}

// latest returns the actions, newest first.
func (l *actionLog) latest() []Action {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.next
	if l.full {
		n = len(l.ring)
	}
	out := make([]Action, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, l.ring[(l.next-i+len(l.ring))%len(l.ring)])
	}
	return out
}
