package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/grant"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/pipeline"
)

// TestGrantsAcrossAHandOver: a pod grants a start for an authority of the
// partition it serves; it stops, revoking the grant, and another pod takes
// the partition over. The grant's late report is unknown to the new
// owner, and the new owner's first grant is at least a floor after the
// first one: a granted start is fenced across the hand-over like the
// pod's own.
func TestGrantsAcrossAHandOver(t *testing.T) {
	t.Parallel()
	const (
		floor = 8 * time.Second
		auth  = "a.example:443"
	)
	js := startJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	startPod := func(id string) (stop func()) {
		log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel).With().Str("pod", id).Logger()
		parts, err := pipeline.New(js, pipeline.Config{
			Policy: &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: 1}}, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		target, err := pipeline.OpenTarget(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		pod, err := parts.StartPod(ctx, &pipeline.PodOptions{PodID: id, Partitions: 1, Target: target,
			LeaseTTL: 2 * time.Second, ShutdownGrace: time.Second, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stopRun := context.WithCancel(ctx)
		ran := make(chan error, 1)
		go func() { ran <- pod.Run(rctx) }()
		return func() {
			stopRun()
			if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("pod %s: %v", id, err)
			}
			parts.Close()
		}
	}
	t0 := time.Now()
	stopA := startPod("pod-a")
	c := grant.NewClient(js.Conn(), "test", time.Second, nil)
	first, err := c.Wait(ctx, auth, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod-a granted %s after its start", time.Since(t0).Round(time.Millisecond))
	if !first.Granted() {
		t.Fatalf("first answer %+v", first)
	}
	stopB := startPod("pod-b")
	defer stopB()
	t0 = time.Now()
	stopA() // revokes the grant, gives the lease up
	t.Logf("pod-a stopped in %s", time.Since(t0).Round(time.Millisecond))
	second, err := c.Wait(ctx, auth, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod-b granted %s after pod-a was asked to stop", time.Since(t0).Round(time.Millisecond))
	if v, err := c.Report(ctx, auth, first, pacer.Response{Status: 200}); err != nil || !v.Unknown {
		t.Errorf("the revoked grant's report: %+v, %v; want unknown", v, err)
	}
	if gap := second.Start.Sub(first.Start); gap < floor {
		t.Errorf("the new owner granted %s after the old owner's grant, floor %s", gap, floor)
	} else {
		t.Logf("the new owner's first grant came %s after the old owner's (floor %s)", gap.Round(time.Millisecond), floor)
	}
	if _, err := c.Report(ctx, auth, second, pacer.Response{Status: 200}); err != nil {
		t.Error(err)
	}
}
