// Package bodyread reads a request body into memory within a size limit
// and a memory budget, charged as the bytes arrive: the one reader of the
// middleware's bodies and of idem serve's gRPC, gRPC-Web and Connect
// calls.
package bodyread

import (
	"bytes"
	"errors"
	"io"
	"math"
)

// Budget is the memory a body's buffer is charged to: TryAcquire takes n
// bytes if there is room, else takes nothing and reports false; Release
// gives back n bytes TryAcquire took.
type Budget interface {
	TryAcquire(n int64) bool
	Release(n int64)
}

// ErrNoRoom is Read's error for a body that found no room left in its
// budget.
var ErrNoRoom = errors.New("idem: no room left for the request body")

// FirstRoom is the room a body's buffer starts with; it then doubles with
// what has arrived.
const FirstRoom = 512

// Read reads body into buf, up to limit bytes. over reports a body
// longer than limit. size is the body's announced length (Content-Length),
// or -1. The buffer grows with what arrives, never ahead of it: 512 bytes,
// then doubling, each step allocated exactly, and never past size+1 (a
// byte to see the end, or a body that lies) nor limit+1, so that a body of
// 1 MiB − 1 bytes ends in a buffer of its size, not one of 2 MiB, and a
// length announced by a client that then sends nothing holds nothing. Each
// step of room is taken from budget, if there is one, before it is read
// into; held is what was taken, for the caller to give back, also when err
// is ErrNoRoom (the budget had no room for the next step). If body.Read
// panics, Read gives back what it took before the panic goes on: its
// caller never learns held. A nil budget charges nothing; the buffer may
// then fill what it already has. A limit of math.MaxInt64 is no limit.
func Read(buf *bytes.Buffer, body io.Reader, size, limit int64, budget Budget) (over bool, held int64, err error) {
	limit = min(limit, math.MaxInt64-1) // limit+1 must not wrap
	reading := false                    // body.Read is running
	defer func() {
		if reading && budget != nil {
			budget.Release(held)
		}
	}()
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
			step := min(max(n, FirstRoom), end-n)
			if budget != nil {
				if !budget.TryAcquire(step) {
					return false, held, ErrNoRoom
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
		reading = true
		m, err := body.Read(b)
		reading = false
		buf.Write(b[:m])
		if err == io.EOF {
			return int64(buf.Len()) > limit, held, nil
		}
		if err != nil {
			return false, held, err
		}
	}
}
