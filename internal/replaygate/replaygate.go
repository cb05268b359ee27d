// Package replaygate carries a bound on the stored answers being written
// to clients at once, from a front door that keeps one (idem serve's
// max_replay_memory) to the middleware that writes replays, through the
// request's context.
package replaygate

import "context"

// Gate admits a replay that holds n bytes in memory while it is written,
// or refuses it (the caller answers 503 busy). A replay it admitted gives
// its bytes back with Release once written, or once its client was cut off.
type Gate interface {
	Acquire(n int64) bool
	Release(n int64)
}

type key struct{}

// With returns ctx carrying g.
func With(ctx context.Context, g Gate) context.Context { return context.WithValue(ctx, key{}, g) }

// From returns the gate ctx carries, or nil.
func From(ctx context.Context) Gate {
	g, _ := ctx.Value(key{}).(Gate)
	return g
}
