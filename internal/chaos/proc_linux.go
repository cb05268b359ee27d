package chaos

import "syscall"

// sysProcAttr makes the kernel kill a proxy whose test process died, so no
// proxy outlives a test that panicked or timed out.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
