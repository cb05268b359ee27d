// Package replaygate carries a bound on the stored answers held in memory
// at once while they are read from the store and written to clients, from
// a front door that keeps one (idem serve's max_replay_memory, an
// *idem.Budget) to the middleware and the engine, through the request's
// context.
package replaygate

import "context"

// Gate admits a replay that holds n bytes in memory, or refuses it (the
// caller answers 503 busy). *idem.Budget implements it. A replay it
// admitted gives its bytes back with Release once written, or once its
// client was cut off.
type Gate interface {
	TryAcquire(n int64) bool
	Release(n int64)
	Max() int64
}

// Take takes n bytes of g, or all of g when n is more than g holds, so
// that a replay larger than the whole budget is written when it is alone
// rather than never. It returns what it took, for Release.
func Take(g Gate, n int64) (took int64, ok bool) { return Raise(g, 0, n) }

// Raise takes what a request that already holds held bytes of g needs to
// hold total, a request holding at most all of g (as Take): it takes
// nothing when held covers it. It returns what it took, for Release.
func Raise(g Gate, held, total int64) (took int64, ok bool) {
	n := min(total, g.Max()) - held
	if n <= 0 {
		return 0, true
	}
	return n, g.TryAcquire(n)
}

type key struct{}

// With returns ctx carrying g.
func With(ctx context.Context, g Gate) context.Context { return context.WithValue(ctx, key{}, g) }

// From returns the gate ctx carries, or nil.
func From(ctx context.Context) Gate {
	g, _ := ctx.Value(key{}).(Gate)
	return g
}
