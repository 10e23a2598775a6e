package replay_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// TestWaitForPodsOnItsClock: while a partition is leased and no pod is
// announced, WaitForPods asks again on its clock until patience has
// passed on it, then fails; a pod announced meanwhile is returned at its
// next ask. Virtual time: the test advances the fake clock once the wait
// has armed its timer, and no wall-clock second passes.
func TestWaitForPodsOnItsClock(t *testing.T) {
	const patience = 10 * time.Second
	for _, tc := range []struct {
		name     string
		advances int  // podsRetry steps the test advances
		announce bool // a pod is announced before the last one
		wantPods bool
	}{
		{name: "no pod within patience", advances: 1 + int(patience/(250*time.Millisecond))},
		{name: "a pod announced meanwhile", advances: 3, announce: true, wantPods: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, _ := brokertest.Streams(t)
			ctx := brokertest.Context(t)
			leases, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: jobs.LeasesBucket})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := leases.Put(ctx, "0", []byte("pod-1")); err != nil {
				t.Fatal(err)
			}
			pods, err := js.CreateKeyValue(ctx, jobs.PodsBucketConfig(time.Minute, 1))
			if err != nil {
				t.Fatal(err)
			}
			clk := clock.NewFake(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC))
			type result struct {
				pods map[string][]string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				p, err := replay.WaitForPods(ctx, js, clk, patience)
				done <- result{p, err}
			}()
			for i := range tc.advances {
				// The wait has armed its retry, for a quarter second from now.
				if r, ok := armed(t, clk, done); ok {
					t.Fatalf("returned after %d retries (%v, %v): want %d", i, r.pods, r.err, tc.advances)
				}
				if tc.announce && i == tc.advances-1 {
					if _, err := pods.Put(ctx, "pod-1", []byte(`{"pod":"pod-1","replay_targets":["file:///x"]}`)); err != nil {
						t.Fatal(err)
					}
				}
				clk.Advance(250 * time.Millisecond)
			}
			r, ok := armed(t, clk, done)
			if !ok {
				t.Fatalf("still waiting after %d retries, %s on its clock: want it returned", tc.advances, clk.Now().Sub(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)))
			}
			if tc.wantPods {
				if r.err != nil || len(r.pods["pod-1"]) != 1 {
					t.Fatalf("got %v, %v: want pod-1 and its target", r.pods, r.err)
				}
				return
			}
			if r.err == nil {
				t.Fatalf("got %v and no error once patience had passed on the clock", r.pods)
			}
		})
	}
}

// armed waits until the fake clock has a timer armed at its now plus a
// quarter second (WaitForPods waits for its next ask), or done has a
// result (returned with true).
func armed[R any](t *testing.T, clk *clock.Fake, done chan R) (R, bool) {
	t.Helper()
	var (
		r   R
		got bool
	)
	waitUntil(t, "WaitForPods waiting on its clock or returning", func() bool {
		select {
		case r = <-done:
			got = true
			return true
		default:
		}
		return slices.Contains(clk.Deadlines(), clk.Now().Add(250*time.Millisecond))
	})
	return r, got
}
