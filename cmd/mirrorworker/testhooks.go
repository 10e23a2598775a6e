package main

import (
	"os"
	"syscall"
	"time"

	"github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/worker"
)

// faultEnv names a parking step, or a step of the mirror target's Put
// (mirror.Fault*), at which the process kills itself with SIGKILL, for the
// crash tests (never a flag: it is not a MIRRORWORKER_
// variable, and only tests set it).
const faultEnv = "MW_FAULT_POINT"

// indexLockWaitEnv sets how long the pod waits for a file target's sha256
// index that another process holds (sumindex.DefaultLockWait when empty or
// not a duration): the process tests that start several pods on one
// mirror set it short, so that each pod after the first does not sit out
// the wait before it runs, without the index, as it would after it.
const indexLockWaitEnv = "MW_INDEX_LOCK_WAIT"

// testHooks are the hooks the tests and the load test give a `run`
// process through its environment, read once at start-up (readTestHooks)
// and nowhere else. The zero value is no hook: production.
type testHooks struct {
	// fault kills the process at a named point (faultEnv); nil: never.
	fault func(point string)
	// departures is the file to which the load test's pods log when each
	// request leaves (departures.Env); empty: none.
	departures string
	// indexLockWait is indexLockWaitEnv's duration; 0: the default.
	indexLockWait time.Duration
}

// readTestHooks reads the hooks from the environment run was given (nil:
// an empty one, no hooks).
func readTestHooks(getenv func(string) string) testHooks {
	if getenv == nil {
		return testHooks{}
	}
	wait, _ := time.ParseDuration(getenv(indexLockWaitEnv))
	return testHooks{fault: faultHook(getenv(faultEnv)), departures: getenv(departures.Env), indexLockWait: wait}
}

// adjust puts the hooks into the worker (pipeline.PodOptions.Adjust).
func (h testHooks) adjust(o *worker.Options, d *worker.Deps) {
	if o.Partitions > 0 {
		o.FaultHook = h.fault
	}
}

func faultHook(point string) func(string) {
	if point == "" {
		return nil
	}
	return func(p string) {
		if p == point {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never continue past the fault point
		}
	}
}
