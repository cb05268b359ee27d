package main

import (
	"bytes"
	"crypto/sha256"
	"hash/maphash"
	"io"
	"net/http"
	"sync"
)

// floor is the least an idempotency middleware that keeps one process's
// promise must do for a request with a fresh key, written only as a
// measuring stick for scripts/bench-http.sh (MODES=floor), never to serve:
// it reads the key, reads the body, fingerprints the method, path and body
// with SHA-256, reserves the key in a locked map (a duplicate gets 409
// while the first runs, 422 with another fingerprint, the stored answer
// once it is done), runs the handler with its answer captured, and stores
// status, header and body. What idem's middleware does beyond it (the
// canonical fingerprint of a JSON body and chosen headers, scopes, fencing
// tokens and the lease's expiry, the engine's outcomes, budgets, metrics
// hooks, a store behind an interface that copies what it keeps) is what
// its cost over this floor pays for.
type floor struct {
	seed   maphash.Seed
	shards [64]floorShard
	next   http.Handler
}

type floorShard struct {
	mu   sync.Mutex
	keys map[string]*floorEntry
	_    [40]byte // keep neighbouring shards' locks off one cache line
}

type floorEntry struct {
	fp     [sha256.Size]byte
	done   bool
	status int
	header http.Header
	body   []byte
}

func newFloor(next http.Handler) *floor {
	f := &floor{seed: maphash.MakeSeed(), next: next}
	for i := range f.shards {
		f.shards[i].keys = make(map[string]*floorEntry)
	}
	return f
}

func (f *floor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "Idempotency-Key is required", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "cannot read the body", http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	h := sha256.New()
	_, _ = io.WriteString(h, r.Method)
	_, _ = h.Write([]byte{0})
	_, _ = io.WriteString(h, r.URL.Path)
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(body)
	var fp [sha256.Size]byte
	h.Sum(fp[:0])

	s := &f.shards[maphash.String(f.seed, key)%uint64(len(f.shards))]
	s.mu.Lock()
	e, found := s.keys[key]
	if !found {
		e = &floorEntry{fp: fp}
		s.keys[key] = e
	}
	var replay floorEntry
	if found {
		replay = *e
	}
	s.mu.Unlock()
	switch {
	case found && replay.fp != fp:
		http.Error(w, "the key was used with another request", http.StatusUnprocessableEntity)
		return
	case found && !replay.done:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "a request with this key is in progress", http.StatusConflict)
		return
	case found:
		for name, values := range replay.header {
			w.Header()[name] = values
		}
		w.WriteHeader(replay.status)
		_, _ = w.Write(replay.body)
		return
	}

	c := &floorCapture{ResponseWriter: w}
	ok := false
	defer func() {
		s.mu.Lock()
		if ok {
			e.status, e.header, e.body, e.done = cmpStatus(c.status), w.Header().Clone(), c.buf.Bytes(), true
		} else {
			delete(s.keys, key) // the handler panicked: the key is free again
		}
		s.mu.Unlock()
	}()
	f.next.ServeHTTP(c, r)
	ok = true
}

func cmpStatus(status int) int {
	if status == 0 {
		return http.StatusOK
	}
	return status
}

// floorCapture passes the handler's answer through and keeps a copy.
type floorCapture struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (c *floorCapture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *floorCapture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.buf.Write(p)
	return c.ResponseWriter.Write(p)
}
