package idemnats

import (
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// maxTerminated bounds how many terminated messages a Guard remembers.
const maxTerminated = 4096

// terminated remembers the last maxTerminated messages a Guard terminated,
// by stream, consumer, stream sequence and the time JetStream stored the
// message (a stream deleted and created again numbers its messages from 1
// again, and its new message at an old one's sequence is another), so that one delivered again is
// terminated again without a reason, whatever it would find now. A Term
// that carries its reason (TermWithReason) is ignored by a consumer leader
// older than 2.10.4, which the guard cannot see during a rolling upgrade
// (it knows only the version of the server it is connected to): without
// this, the message would come back after every AckWait, forever.
type terminated struct {
	mu   sync.Mutex
	set  map[string]struct{}
	ring [maxTerminated]string
	next int
}

// place is msg's place in its consumer, "" when it has no metadata.
func place(msg jetstream.Msg) string {
	md, err := msg.Metadata()
	if err != nil || md == nil {
		return ""
	}
	return md.Stream + "\x00" + md.Consumer + "\x00" + strconv.FormatUint(md.Sequence.Stream, 10) + "\x00" + strconv.FormatInt(md.Timestamp.UnixNano(), 10)
}

// add remembers the message at p, forgetting the oldest beyond
// maxTerminated.
func (t *terminated) add(p string) {
	if p == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.set[p]; ok {
		return
	}
	if t.set == nil {
		t.set = make(map[string]struct{})
	}
	if old := t.ring[t.next]; old != "" {
		delete(t.set, old)
	}
	t.ring[t.next] = p
	t.next = (t.next + 1) % maxTerminated
	t.set[p] = struct{}{}
}

// has reports whether the message at p was terminated.
func (t *terminated) has(p string) bool {
	if p == "" {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.set[p]
	return ok
}
