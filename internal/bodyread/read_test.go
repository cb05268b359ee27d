package bodyread

import (
	"bytes"
	"errors"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
)

// budget is a Budget that counts what is held.
type budget struct {
	max  int64
	used atomic.Int64
}

func (b *budget) TryAcquire(n int64) bool {
	if b.used.Load()+n > b.max {
		return false
	}
	b.used.Add(n)
	return true
}

func (b *budget) Release(n int64) { b.used.Add(-n) }

// A limit of math.MaxInt64 (no limit in practice) reads a body of unknown
// length whole, charging only what its buffer grew to.
func TestReadUnboundedLimit(t *testing.T) {
	b := &budget{max: 1 << 20}
	var buf bytes.Buffer
	body := strings.Repeat("x", 3000)
	over, held, err := Read(&buf, iotest.OneByteReader(strings.NewReader(body)), -1, math.MaxInt64, b)
	if over || err != nil || buf.String() != body {
		t.Fatalf("Read = over %v, err %v, %d bytes; want the %d-byte body", over, err, buf.Len(), len(body))
	}
	if held <= 0 || held != b.used.Load() || held > 2*int64(len(body)) {
		t.Fatalf("held %d, budget used %d, for a %d-byte body", held, b.used.Load(), len(body))
	}
}

// panicky sends n bytes, then panics.
type panicky struct{ n int }

func (p *panicky) Read(b []byte) (int, error) {
	if p.n == 0 {
		panic("body read failed")
	}
	m := min(len(b), p.n)
	p.n -= m
	return m, nil
}

// A body whose Read panics after some bytes leaves nothing taken from the
// budget: Read's caller never learns what it held.
func TestReadGivesBackOnPanic(t *testing.T) {
	b := &budget{max: 1 << 20}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the body's panic did not reach Read's caller")
			}
		}()
		var buf bytes.Buffer
		Read(&buf, &panicky{n: 5000}, -1, 1<<20, b)
	}()
	if used := b.used.Load(); used != 0 {
		t.Fatalf("%d bytes of the budget still held after the body panicked", used)
	}
}

// Read at and around its limit, with a true, a lying and no announced
// length, a body that fails half way, a budget with no room and none:
// what it reports, and that held is what the budget lent.
func TestReadBoundaries(t *testing.T) {
	const limit = 4096
	boom := errors.New("connection reset")
	for _, c := range []struct {
		name       string
		body       io.Reader
		size       int64
		max        int64 // the budget's size; 0: no budget
		over       bool
		err        error
		read       int // bytes in the buffer, when neither over nor err
		heldAtMost int64
	}{
		{"exactly limit", strings.NewReader(strings.Repeat("a", limit)), limit, 1 << 20, false, nil, limit, limit + 1},
		{"exactly limit, no length", strings.NewReader(strings.Repeat("a", limit)), -1, 1 << 20, false, nil, limit, limit + 1},
		{"limit+1", strings.NewReader(strings.Repeat("a", limit+1)), limit + 1, 1 << 20, true, nil, 0, limit + 1},
		{"limit+1, no length", strings.NewReader(strings.Repeat("a", limit+1)), -1, 1 << 20, true, nil, 0, limit + 1},
		{"announces 10, sends limit+1", strings.NewReader(strings.Repeat("a", limit+1)), 10, 1 << 20, true, nil, 0, limit + 1},
		{"announces limit, sends 3", strings.NewReader("abc"), limit, 1 << 20, false, nil, 3, 512},
		{"announces 0, sends 3", strings.NewReader("abc"), 0, 1 << 20, false, nil, 3, 512},
		{"fails half way", io.MultiReader(strings.NewReader(strings.Repeat("a", 1000)), iotest.ErrReader(boom)), -1, 1 << 20, false, boom, 0, 2048},
		{"no room", strings.NewReader(strings.Repeat("a", limit)), -1, 1000, false, ErrNoRoom, 0, 1000},
		{"no budget", strings.NewReader(strings.Repeat("a", limit+1)), -1, 0, true, nil, 0, 0},
		{"no budget, fits", strings.NewReader("abc"), -1, 0, false, nil, 3, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b *budget
			var bb Budget
			if c.max > 0 {
				b = &budget{max: c.max}
				bb = b
			}
			var buf bytes.Buffer
			over, held, err := Read(&buf, c.body, c.size, limit, bb)
			if over != c.over || !errors.Is(err, c.err) {
				t.Fatalf("over %v, err %v; want %v, %v", over, err, c.over, c.err)
			}
			if !over && err == nil && buf.Len() != c.read {
				t.Fatalf("read %d bytes, want %d", buf.Len(), c.read)
			}
			if int64(buf.Len()) > limit+1 {
				t.Fatalf("read %d bytes past a limit of %d", buf.Len(), limit)
			}
			if b != nil && held != b.used.Load() {
				t.Fatalf("held %d, the budget lent %d", held, b.used.Load())
			}
			if held > c.heldAtMost || held < 0 {
				t.Fatalf("held %d, want at most %d", held, c.heldAtMost)
			}
		})
	}
}
