package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestReplayOpener: a replay job's target is the pod's own or an allowed
// one, for a run with an entry in MIRROR_REPLAYS; any other target is
// refused, and a run without an entry is over.
func TestReplayOpener(t *testing.T) {
	js, _ := brokertest.JetStream(t, brokertest.Start(t, broker.EmbeddedOptions{}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	own, err := OpenTarget(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := OpenTarget(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o := &replayOpener{js: js, targets: &ReplayTargets{Own: TargetSpec(own.Root()), OwnT: own,
		Allowed: map[string]worker.Target{TargetSpec(other.Root()): other}}, clk: clock.Real{}}

	// No bucket yet: no replay is running.
	if _, err := o.open(ctx, "r1", TargetSpec(own.Root())); !errors.Is(err, worker.ErrReplayOver) {
		t.Fatalf("no bucket: %v, want ErrReplayOver", err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: jobs.ReplaysBucket, TTL: jobs.ReplaysTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "r1", jobs.ReplayRun{Run: "r1"}.Encode()); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{TargetSpec(own.Root()), TargetSpec(other.Root())} {
		if tg, err := o.open(ctx, "r1", spec); err != nil || tg == nil {
			t.Errorf("open %s: %v", spec, err)
		}
	}
	if _, err := o.open(ctx, "r1", "file:///somewhere/else"); err == nil || errors.Is(err, worker.ErrReplayOver) ||
		!strings.Contains(err.Error(), "--replay-target") {
		t.Errorf("a target not allowed: %v", err)
	}
	if _, err := o.open(ctx, "r2", TargetSpec(own.Root())); !errors.Is(err, worker.ErrReplayOver) {
		t.Errorf("a run without an entry: %v, want ErrReplayOver", err)
	}
	if got, want := o.targets.Specs(), 2; len(got) != want {
		t.Errorf("specs %v, want %d", got, want)
	}
}
