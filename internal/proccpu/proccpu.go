// Package proccpu reads the CPU time that processes on this machine have
// used, from Linux's /proc, for the benchmarks that divide a server's CPU
// time (a database, a broker) by the work it did.
package proccpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// StatTicks returns utime + stime from a /proc/PID/stat line. The command
// name, in parentheses, may hold spaces and parentheses itself: the fields
// are counted from the last ')'.
func StatTicks(line string) (int64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", line)
	}
	f := strings.Fields(line[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat line %q", line)
	}
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, err
	}
	s, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, err
	}
	return u + s, nil
}

// Ticks returns the CPU ticks process pid has used, and false when it is
// gone (or this is not Linux).
func Ticks(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	t, err := StatTicks(string(b))
	return t, err == nil
}

// Named returns the processes whose command name (/proc/PID/comm, never
// the command line) is one of names.
func Named(names ...string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/comm")
	var pids []int
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		comm := strings.TrimSpace(string(b))
		for _, n := range names {
			if comm == n {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// Meter measures the CPU time of a set of processes from its start. The
// set is read at both ends: a process that started in between counts
// whole, one that ended in between is missed.
type Meter struct {
	pids   func() []int
	before map[int]int64
}

// Start starts a Meter over the processes pids returns; a nil pids
// measures nothing.
func Start(pids func() []int) *Meter {
	m := &Meter{pids: pids, before: map[int]int64{}}
	if pids != nil {
		for _, p := range pids() {
			if t, ok := Ticks(p); ok {
				m.before[p] = t
			}
		}
	}
	return m
}

// Elapsed returns the CPU time the processes used since Start.
func (m *Meter) Elapsed() time.Duration {
	if m.pids == nil {
		return 0
	}
	var sum int64
	for _, p := range m.pids() {
		if t, ok := Ticks(p); ok && t >= m.before[p] {
			sum += t - m.before[p]
		}
	}
	return time.Duration(sum) * time.Second / clockTicks
}

// Self returns the user and system CPU time this process has used.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
