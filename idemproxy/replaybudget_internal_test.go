package idemproxy

import "testing"

// A replay larger than the whole replay budget takes all of it: it is
// written when no other replay is held, never refused forever, and gives
// back exactly what it took.
func TestReplayBudgetTakesAnOversizedReplayAlone(t *testing.T) {
	t.Parallel()
	b := &replayBudget{max: 10}
	if !b.Acquire(25) {
		t.Fatal("an oversized replay was refused with the budget empty")
	}
	if b.Acquire(1) {
		t.Error("a replay was admitted beside one that holds the whole budget")
	}
	b.Release(25)
	if got := b.used.Load(); got != 0 {
		t.Errorf("after the release, %d bytes still held", got)
	}
	if !b.Acquire(10) {
		t.Error("the whole budget was not back")
	}
}
