package clock_test

import (
	"sync"
	"testing"
	"time"
)

// BenchmarkWallAgainstMonotonic reads time.Now in every core as fast as it
// can and reports how far the wall clock moved against the monotonic clock,
// each reading's against the start's: wall_gain_ns is the most the wall
// clock got ahead (a step forward, or two CPUs whose clocks disagree), and
// mono_lag_ns the most a reading's monotonic part trailed its wall part (Go
// reads CLOCK_REALTIME, then CLOCK_MONOTONIC, so a thread preempted between
// the two reads them apart; harmless, as each part is still a true reading
// of its own clock). The pacer keeps its deadlines on the wall clock, so a
// wall_gain_ns above zero during a cooldown shortens it by as much (ADR
// 0004, "Which clock a cooldown runs on"). It measures the machine, not the
// code: run it beside the load under which a test saw an early request.
func BenchmarkWallAgainstMonotonic(b *testing.B) {
	t0 := time.Now()
	offset := func(t time.Time) int64 { return (t.UnixNano() - t0.UnixNano()) - int64(t.Sub(t0)) }
	// The start's offset is the largest of a few readings: a reading can
	// only understate it (its monotonic part read late).
	base := offset(t0)
	for range 1000 {
		base = max(base, offset(time.Now()))
	}
	var mu sync.Mutex
	var gain, lag int64
	b.RunParallel(func(pb *testing.PB) {
		var g, l int64
		for pb.Next() {
			d := offset(time.Now()) - base
			g, l = max(g, d), max(l, -d)
		}
		mu.Lock()
		gain, lag = max(gain, g), max(lag, l)
		mu.Unlock()
	})
	b.ReportMetric(float64(gain), "wall_gain_ns")
	b.ReportMetric(float64(lag), "mono_lag_ns")
}
