package idem

// ReadLimited exposes readLimited to the tests of the package's buffers.
var ReadLimited = readLimited

// ErrNoRoom is readLimited's error for a body its budget has no room for.
var ErrNoRoom = errNoRoom

// ReleaseBudget gives n bytes back to b.
func ReleaseBudget(b *BodyBudget, n int64) { b.Release(n) }

// AcquireBudget takes n bytes of b.
func AcquireBudget(b *BodyBudget, n int64) bool { return b.TryAcquire(n) }
