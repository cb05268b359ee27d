package idem

import (
	"bytes"
	"io"

	"github.com/idem-dev/idem/internal/bodyread"
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
var errNoRoom = bodyread.ErrNoRoom

// readLimited is bodyread.Read on the middleware's budget, which may be
// nil (no budget).
func readLimited(buf *bytes.Buffer, body io.Reader, size, limit int64, budget *BodyBudget) (over bool, held int64, err error) {
	if budget == nil {
		return bodyread.Read(buf, body, size, limit, nil)
	}
	return bodyread.Read(buf, body, size, limit, budget)
}
