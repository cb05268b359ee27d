package idemproxy

// The stored answers held in memory while they are read from the store and
// written to clients are bounded by one idem.Budget of
// Config.MaxReplayMemory bytes, which every route's middleware finds in the
// request's context (replaygate): the engine takes a large answer's share
// before it reads its body from the store, the middleware a small one's
// before it writes it, and both give it back once the client took it or
// was cut off. A replay that does not fit is refused at once (503 busy),
// rather than queued.

// minReplayMemory is the least Config.MaxReplayMemory: the largest stored
// answer (idem's MaxResponseBody, 1 MiB) and what decoding it holds.
const minReplayMemory = 2 << 20
