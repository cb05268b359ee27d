package proccpu

import (
	"os"
	"runtime"
	"slices"
	"testing"
	"time"
)

func TestStatTicks(t *testing.T) {
	t.Parallel()
	// A command name with spaces and parentheses: fields count from the last ')'.
	line := "123 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0"
	got, err := StatTicks(line)
	if err != nil || got != 300 {
		t.Errorf("StatTicks = %d, %v; want 300", got, err)
	}
	for _, bad := range []string{"no parenthesis", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 u s"} {
		if _, err := StatTicks(bad); err == nil {
			t.Errorf("StatTicks(%q) succeeded", bad)
		}
	}
}

// TestMeterCountsOwnWork burns CPU in this process and finds it through
// /proc, by pid, as a server's processes are found.
func TestMeterCountsOwnWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	t.Parallel()
	pid := os.Getpid()
	m := Start(func() []int { return []int{pid} })
	self := Self()
	x := 0
	for Self()-self < 100*time.Millisecond {
		for i := range 1_000_000 {
			x += i
		}
	}
	_ = x
	// Ticks are 10 ms: 100 ms of own CPU is at least 9 of them.
	if got := m.Elapsed(); got < 90*time.Millisecond {
		t.Errorf("Elapsed = %v after 100ms of CPU in this process", got)
	}
	if Start(nil).Elapsed() != 0 {
		t.Error("a Meter over no processes measured something")
	}
	if _, ok := Ticks(-1); ok {
		t.Error("Ticks of pid -1 succeeded")
	}
}

func TestNamedFindsThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	t.Parallel()
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	comm := string(b[:len(b)-1])
	if !slices.Contains(Named("no-such-process-name", comm), os.Getpid()) {
		t.Errorf("Named(%q) misses this process", comm)
	}
	if pids := Named("no-such-process-name"); len(pids) != 0 {
		t.Errorf("Named found %v", pids)
	}
}
