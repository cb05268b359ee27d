package idemmysql

import (
	"slices"
	"testing"

	"github.com/idem-dev/idem/internal/groupcommit"
)

// TestChunks: a multi-row statement takes at most maxChunkOps calls and
// about maxChunkBytes of values, and at least one call, whatever its size.
func TestChunks(t *testing.T) {
	ops := func(sizes ...int) []*groupcommit.Op {
		out := make([]*groupcommit.Op, len(sizes))
		for i, n := range sizes {
			out[i] = &groupcommit.Op{Reason: string(make([]byte, n))}
		}
		return out
	}
	size := func(op *groupcommit.Op) int { return len(op.Reason) }
	lens := func(parts [][]*groupcommit.Op) []int {
		var out []int
		for _, p := range parts {
			out = append(out, len(p))
		}
		return out
	}
	for _, c := range []struct {
		name string
		ops  []*groupcommit.Op
		size func(*groupcommit.Op) int
		want []int
	}{
		{"none", nil, size, nil},
		{"small", ops(10, 10, 10), size, []int{3}},
		{"by bytes", ops(maxChunkBytes/2, maxChunkBytes/2, 1, maxChunkBytes), size, []int{2, 1, 1}},
		{"one too large alone", ops(2*maxChunkBytes, 1), size, []int{1, 1}},
		{"by count", make([]*groupcommit.Op, 2*maxChunkOps+1), nil, []int{maxChunkOps, maxChunkOps, 1}},
	} {
		if got := lens(chunks(c.ops, c.size)); !slices.Equal(got, c.want) {
			t.Errorf("%s: chunks of %v, want %v", c.name, got, c.want)
		}
	}
}
