package idemredis

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// A script whose reply is lost (the connection breaks or times out after
// the script was sent) may or may not have run. The store sends it again,
// up to Config.Resends times (see run), so a script can run twice for one
// call, the second time on a record its first run already changed. To tell
// that second run from a new call (a second Complete with the same token
// must fail), every changing script after Reserve carries a call id, random
// per call and the same in a resend:
//
//   - Complete, Escalate, Takeover and Resolve (complete) store it in the
//     record's lc field. A run whose fence fails on a record whose lc is its
//     own call id reports success: its first run made the change.
//   - Release, Resolve (release) and Delete remove the record, so they
//     leave a tombstone, <prefix>:{<tag>}:g, holding the call id for
//     tombstoneTTL. A run that finds the record missing and the tombstone
//     holding its call id reports success.
//   - Extend needs neither: its resend passes the fence again and renews the
//     lease from a later now, or fails it because the record changed hands
//     in between, which is a lost lease.
//
// Reserve needs no call id: a pending record with the call's own token
// (unique per attempt) and fingerprint is its own insert.
//
// The same holds with IfExpired: a Release or Escalate of an expired lease
// whose first run went through reports success, not ErrLeaseLost. Only a
// resend that comes after someone else changed the record again (for
// instance reserved the released key anew and released it too, within the
// tombstone's life, or took over and completed the record) still reports
// ErrLeaseLost, truthfully about the record as it now is.

// tombstoneTTL is how long a tombstone stays: far longer than the resends
// take (backoff and the connection's timeouts), yet short enough that
// tombstones of released keys do not pile up.
const tombstoneTTL = 5 * time.Minute

// tombstoneMillis is tombstoneTTL as the scripts take it.
var tombstoneMillis = strconv.FormatInt(tombstoneTTL.Milliseconds(), 10)

// Backoff between resends: minResendWait, doubling up to maxResendWait.
const (
	minResendWait = 8 * time.Millisecond
	maxResendWait = 512 * time.Millisecond
)

// newCallID returns 128 random bits, as callIDLen bytes: the record keeps
// the id in a field of that fixed size. The id only has to differ from
// every other call's on the same record, so the runtime's fast generator
// (ChaCha8, seeded from the system) is enough.
func newCallID() string {
	var b [callIDLen]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return string(b[:])
}

// run executes script (EVALSHA, then EVAL if the node does not have it)
// and returns its reply. When the reply is lost to a broken or timed-out
// connection, it sends the same script with the same arguments again, up to
// Config.Resends times, pausing between attempts, while ctx lasts. Errors
// come back interpreted (see interpretError).
func (s *Store) run(ctx context.Context, script *rueidis.Lua, keys, args []string) (rueidis.RedisMessage, error) {
	wait := minResendWait
	for resends := 0; ; resends++ {
		msg, err := script.Exec(ctx, s.client, keys, args).ToMessage()
		if err == nil {
			return msg, nil
		}
		if resends >= s.cfg.Resends || !isConnError(err) || errors.Is(err, rueidis.ErrClosing) || ctx.Err() != nil {
			return msg, interpretError(ctx, err)
		}
		t := time.NewTimer(rand.N(wait/2) + wait/2)
		select {
		case <-ctx.Done():
			t.Stop()
			return msg, interpretError(ctx, err)
		case <-t.C:
		}
		wait = min(2*wait, maxResendWait)
	}
}
