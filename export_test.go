package idem

import "time"

// SetHeartbeatLinger sets how long e's heartbeat goroutine stays after its
// last lease. Tests in a synctest bubble set it to zero, so the goroutine
// has exited when the bubble ends.
func SetHeartbeatLinger(e *Engine, d time.Duration) { e.hb.linger = d }
