package bandwidth_test

import (
	"fmt"
	"time"

	"github.com/mirrorworker/mirrorworker/bandwidth"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// A pod's caps: one origin held to 1 MiB/s, the pod to 10 MiB/s over
// everything; the fetch client spends every body read on them, and a live
// policy change goes to SetPolicy.
func Example() {
	policy := &pacer.Policy{
		Default:     pacer.Limits{Floor: time.Second, MaxInFlight: 2},
		Authorities: map[string]pacer.Limits{"files.example.org:443": {Floor: time.Second, MaxInFlight: 2, Bandwidth: 1 << 20}},
	}
	caps, err := bandwidth.New(&bandwidth.Options{Policy: policy, PodLimit: 10 << 20})
	if err != nil {
		panic(err)
	}
	client := fetch.New(&fetch.Options{Throttle: caps})
	defer client.CloseIdleConnections()

	// Later, the operator halves the cap: bodies in flight take it from
	// their next read.
	halved := *policy
	halved.Authorities = map[string]pacer.Limits{"files.example.org:443": {Floor: time.Second, MaxInFlight: 2, Bandwidth: 512 << 10}}
	caps.SetPolicy(&halved)

	fmt.Println("one read takes at most", bandwidth.Burst(1<<20), "bytes at 1 MiB/s,", bandwidth.Burst(512<<10), "at 512 KiB/s")
	// Output: one read takes at most 65536 bytes at 1 MiB/s, 32768 at 512 KiB/s
}
