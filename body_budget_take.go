package idem

// Take takes n bytes of the budget for a body read outside the middleware
// (idem serve's gRPC calls), and reports false, taking nothing, when they
// are not left. Give them back with Give once the body is let go.
func (b *BodyBudget) Take(n int64) bool { return b.acquire(n) }

// Give gives back n bytes that Take took.
func (b *BodyBudget) Give(n int64) { b.release(n) }
