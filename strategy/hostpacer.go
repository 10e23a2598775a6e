package strategy

import (
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// newHostPacer maps Options onto the HostPacer's own options. Scale goes to
// pacer.Options.Scale, which multiplies the HostPacer's docs/contract.md section 3
// constants (the 2 s first step, the 60 s cap and fallback, the 600 s pause
// cap, the 1 s probe and in-flight waits) as the other strategies' are.
func newHostPacer(o Options) (Pacer, error) {
	floor := o.Floor
	switch {
	case floor == 0:
		floor = pacer.DefaultFloor
	case floor < 0:
		floor = 0
	}
	capN := o.MaxInFlight
	if capN == 0 {
		capN = pacer.DefaultMaxInFlight
	}
	scale := o.Scale
	if scale == 0 {
		scale = 1
	}
	quiet := time.Duration(float64(pacer.DefaultQuietWindow) * scale)
	if quiet <= 0 {
		quiet = time.Nanosecond // 0 would mean the default, not "no wait"
	}
	return pacer.New(&pacer.Options{
		Policy:      &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: capN}},
		QuietWindow: quiet,
		Rand:        o.Rand,
		Scale:       scale,
		StartGuard:  o.StartGuard,
	}), nil
}
