package idemredis

import (
	"context"
	"time"

	"github.com/redis/rueidis"
)

// rueidis returns as soon as a call's ctx ends, but still sends a script
// it has queued, and drops the reply. For Reserve and Takeover, which give
// a token the record, that would be an orphan in the making: the engine
// releases the token of a failed claim (it may have gone through), and that
// Release, sent over another of the client's connections, could reach the
// server before the abandoned script, find nothing to release, and leave
// the record to a token nobody holds until its lease runs out.
//
// So a claim is sent detached from ctx's cancellation, and when ctx ends
// first, claim still waits up to abandonGrace for the script's reply
// before it returns ctx's error: whatever the caller sends next reaches the
// server after the claim. The wait is bounded so that a server that does
// not answer cannot hold a cancelled caller for long; past it, the claim's
// reply is dropped as rueidis would have, and only then can a Release
// overtake it.

// abandonGrace bounds how long a claim whose ctx ended waits for its
// script's reply.
const abandonGrace = time.Second

// claim runs script, as run does, for Reserve and Takeover (see above).
func (s *Store) claim(ctx context.Context, script *rueidis.Lua, keys, args []string) (rueidis.RedisMessage, error) {
	if ctx.Done() == nil {
		return s.run(ctx, script, keys, args)
	}
	if err := ctx.Err(); err != nil {
		return rueidis.RedisMessage{}, interpretError(ctx, err) // nothing sent
	}
	type reply struct {
		msg rueidis.RedisMessage
		err error
	}
	replies := make(chan reply, 1)
	go func() {
		msg, err := s.run(context.WithoutCancel(ctx), script, keys, args)
		replies <- reply{msg, err}
	}()
	select {
	case r := <-replies:
		return r.msg, r.err
	case <-ctx.Done():
	}
	t := time.NewTimer(abandonGrace)
	defer t.Stop()
	select {
	case <-replies:
	case <-t.C:
	}
	return rueidis.RedisMessage{}, interpretError(ctx, ctx.Err())
}
