package testenv

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that is safe for concurrent use, for a logger
// (slog.NewTextHandler(&buf, nil)) whose output a test reads while other
// goroutines may still write.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
