//go:build !linux

package chaos

import "syscall"

// sysProcAttr has nothing to add outside Linux, where no parent-death
// signal exists: a proxy whose test process died must be stopped by hand.
func sysProcAttr() *syscall.SysProcAttr { return nil }
