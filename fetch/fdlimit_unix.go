//go:build unix

package fetch

import "syscall"

// fileLimit returns the process's soft limit of open files (which the Go
// runtime raises to the hard limit at start-up), or 0 if unknown.
func fileLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}
