//go:build !linux

package loadtest

import "syscall"

// podSysProcAttr: only Linux can tie a child's life to its parent's; here a
// pod outlives a load test that is killed (stop it by hand).
func podSysProcAttr() *syscall.SysProcAttr { return nil }
