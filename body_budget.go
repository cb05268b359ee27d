package idem

import (
	"bytes"
	"errors"
	"io"
)

// BodyBudget is the Budget of the request bodies the middleware reads for
// their fingerprints (Config.BodyBudget), across every request and every
// middleware that shares it. A body is charged as its bytes arrive, never
// for the length it announces: its buffer starts at 512 bytes and doubles
// with what it has received (never past its Content-Length, or its limit,
// and a byte), and every step is taken from the budget before the buffer
// grows. The charge is given back when the request is done, on every path
// (an answer, an error, a client gone, a panic). A body that finds no room
// left is refused at once with 503 busy and Retry-After, unread, its key
// never reserved: a client holding its share while it trickles is bounded
// by the server's read timeout, not by the patience of the others.
type BodyBudget = Budget

// NewBodyBudget returns a budget of max bytes for request bodies. It
// panics unless max is positive.
func NewBodyBudget(max int64) *BodyBudget { return NewBudget(max) }

// errNoRoom is readLimited's error for a body that found no room left in
// its budget.
var errNoRoom = errors.New("idem: no room left for the request body")

// firstRoom is the room a body's buffer starts with; it then doubles with
// what has arrived.
const firstRoom = 512

// readLimited reads body into buf, up to limit bytes. over reports a body
// longer than limit. size is the body's announced length (Content-Length),
// or -1. The buffer grows with what arrives, never ahead of it: 512 bytes,
// then doubling, each step allocated exactly, and never past size+1 (a
// byte to see the end, or a body that lies) nor limit+1, so that a body of
// 1 MiB − 1 bytes ends in a buffer of its size, not one of 2 MiB, and a
// length announced by a client that then sends nothing holds nothing. Each
// step of room is taken from budget, if there is one, before it is read
// into; held is what was taken, for the caller to give back, also when err
// is errNoRoom (the budget had no room for the next step).
func readLimited(buf *bytes.Buffer, body io.Reader, size, limit int64, budget *BodyBudget) (over bool, held int64, err error) {
	end := limit + 1
	if size > 0 && size <= limit {
		end = size + 1
	}
	room := int64(buf.Cap()) // what may be filled without another step
	if budget != nil {
		room = 0
	}
	for {
		n := int64(buf.Len())
		if n > limit {
			return true, held, nil
		}
		if n >= end {
			end = limit + 1 // longer than it announced
		}
		if n >= room {
			step := min(max(n, firstRoom), end-n)
			if budget != nil {
				if !budget.TryAcquire(step) {
					return false, held, errNoRoom
				}
				held += step
			}
			room = n + step
			if int64(buf.Cap()) < room {
				grown := make([]byte, n, room)
				copy(grown, buf.Bytes())
				*buf = *bytes.NewBuffer(grown)
			}
		}
		b := buf.AvailableBuffer()
		b = b[:min(int64(cap(b)), room-n, end-n)]
		m, err := body.Read(b)
		buf.Write(b[:m])
		if err == io.EOF {
			return int64(buf.Len()) > limit, held, nil
		}
		if err != nil {
			return false, held, err
		}
	}
}
