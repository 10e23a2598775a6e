package loadtest

import "syscall"

// podSysProcAttr kills a pod when the load test dies without stopping it
// (SIGKILL, a crash): its JetStream server lived in the load test, so the
// pod could only retry forever.
func podSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
