package capacity

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

// statTicks returns utime + stime from a /proc/PID/stat line. The command
// name, in parentheses, may hold spaces and parentheses itself: the fields
// are counted from the last ')'.
func statTicks(line string) (int64, error) {
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

// procTicks returns the CPU ticks process pid has used, and false when it
// is gone.
func procTicks(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	t, err := statTicks(string(b))
	return t, err == nil
}

// pidsNamed returns the processes whose command name (/proc/PID/comm, never
// the command line) is one of names.
func pidsNamed(names ...string) []int {
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

// serverCPU samples the CPU time of a server's processes. pids is called
// at both ends: a process that started in between counts whole, one that
// ended in between is missed.
type serverCPU struct {
	pids   func() []int
	before map[int]int64
}

func startServerCPU(pids func() []int) *serverCPU {
	c := &serverCPU{pids: pids, before: map[int]int64{}}
	if pids != nil {
		for _, p := range pids() {
			if t, ok := procTicks(p); ok {
				c.before[p] = t
			}
		}
	}
	return c
}

// elapsed returns the CPU time the processes used since the start.
func (c *serverCPU) elapsed() time.Duration {
	if c.pids == nil {
		return 0
	}
	var sum int64
	for _, p := range c.pids() {
		if t, ok := procTicks(p); ok && t >= c.before[p] {
			sum += t - c.before[p]
		}
	}
	return time.Duration(sum) * time.Second / clockTicks
}

// selfCPU returns the user and system CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
