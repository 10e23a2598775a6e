package main

import (
	"os"
	"syscall"

	"github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/worker"
)

// faultEnv names a parking step, or a step of the mirror target's Put
// (mirror.Fault*), at which the process kills itself with SIGKILL, for the
// crash tests (never a flag: it is not a MIRRORWORKER_
// variable, and only tests set it).
const faultEnv = "MW_FAULT_POINT"

// testHooks are the hooks the tests and the load test give a `run`
// process through its environment, read once at start-up (readTestHooks)
// and nowhere else. The zero value is no hook: production.
type testHooks struct {
	// fault kills the process at a named point (faultEnv); nil: never.
	fault func(point string)
	// departures is the file to which the load test's pods log when each
	// request leaves (departures.Env); empty: none.
	departures string
}

// readTestHooks reads the hooks from the environment run was given (nil:
// an empty one, no hooks).
func readTestHooks(getenv func(string) string) testHooks {
	if getenv == nil {
		return testHooks{}
	}
	return testHooks{fault: faultHook(getenv(faultEnv)), departures: getenv(departures.Env)}
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
