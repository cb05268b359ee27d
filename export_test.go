package idem

import "time"

// SetHeartbeatLinger sets how long e's heartbeat goroutine stays after its
// last lease. Tests in a synctest bubble set it to zero, so the goroutine
// has exited when the bubble ends.
func SetHeartbeatLinger(e *Engine, d time.Duration) { e.hb.linger = d }

// SetOrphanTimeout sets how long e tries to release the reservation of a
// Reserve that failed. Tests that check the release happens, on a machine
// too loaded to write within the default 250ms, set it longer.
func SetOrphanTimeout(e *Engine, d time.Duration) { e.orphanTimeout = d }
