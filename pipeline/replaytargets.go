package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/worker"
)

// ReplayTargets are the targets a pod stores replay jobs into
// (docs/adr/0025): its own, and those its operator allowed with
// `run --replay-target`, each opened once at start-up and keyed by its
// canonical spec (TargetSpec). A replay job naming any other target is
// dead-lettered into the replays' stream, so that a job of the stream
// cannot make a pod write where its operator did not say.
type ReplayTargets struct {
	Own     string // the pod's own target's spec
	OwnT    worker.Target
	Allowed map[string]worker.Target
}

// Specs returns every spec the pod takes replay jobs into, sorted.
func (r *ReplayTargets) Specs() []string {
	if r == nil {
		return nil
	}
	out := []string{}
	if r.Own != "" {
		out = append(out, r.Own)
	}
	for s := range r.Allowed {
		if s != r.Own {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// TargetSpec is the canonical spec of a target whose Root is root: root
// itself for a bucket (s3://BUCKET/PREFIX), file://<root> for a directory.
// A replay names its target this way and a pod looks it up this way.
func TargetSpec(root string) string {
	if strings.Contains(root, "://") {
		return root
	}
	return "file://" + root
}

// replayOpener resolves the target of a replay job (worker.Deps.ReplayTarget):
// an allowed one, for a run that has its entry in jobs.ReplaysBucket.
type replayOpener struct {
	js      jetstream.JetStream
	targets *ReplayTargets
	clk     clock.Clock // times how long an entry read is trusted

	mu   sync.Mutex
	kv   jetstream.KeyValue
	live map[string]time.Time // run -> when its entry was last seen
}

// liveFor is how long a run's entry, once read, is trusted.
const liveFor = 2 * time.Second

func (o *replayOpener) open(ctx context.Context, run, spec string) (worker.Target, error) {
	var t worker.Target
	switch {
	case spec == o.targets.Own && o.targets.OwnT != nil:
		t = o.targets.OwnT
	case o.targets.Allowed[spec] != nil:
		t = o.targets.Allowed[spec]
	default:
		return nil, fmt.Errorf("pod does not write replay target %q: its own is %s, and run --replay-target allows %v", spec, o.targets.Own, o.targets.Specs())
	}
	if err := o.check(ctx, run); err != nil {
		return nil, err
	}
	return replayTarget{t}, nil
}

// check returns worker.ErrReplayOver when run has no entry in
// jobs.ReplaysBucket (its replay ended or died). A lookup that fails
// otherwise lets the job through: a NATS hiccup must not drop work.
func (o *replayOpener) check(ctx context.Context, run string) error {
	now := o.clk.Now()
	o.mu.Lock()
	seen, kv := o.live[run], o.kv
	o.mu.Unlock()
	if now.Sub(seen) < liveFor {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if kv == nil {
		var err error
		if kv, err = o.js.KeyValue(lctx, jobs.ReplaysBucket); errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("replay %s: %w", run, worker.ErrReplayOver)
		} else if err != nil {
			return nil
		}
		o.mu.Lock()
		o.kv = kv
		o.mu.Unlock()
	}
	if _, err := kv.Get(lctx, run); errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("replay %s: %w", run, worker.ErrReplayOver)
	} else if err != nil {
		return nil
	}
	o.mu.Lock()
	if o.live == nil {
		o.live = map[string]time.Time{}
	}
	o.live[run] = now
	o.mu.Unlock()
	return nil
}

// replayTarget is a target as replay jobs use it: its own failures (full,
// read-only) are the replay's jobs' failures, retried and dead-lettered as
// theirs, not a reason for the pod to stop taking live work
// (worker/targethealth.go).
type replayTarget struct{ worker.Target }

func (t replayTarget) Put(ctx context.Context, key string, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	got, err := t.Target.Put(ctx, key, body, want, m)
	if code := mirror.FailureCode(err); code != "" {
		err = fmt.Errorf("replay target (%s): %v", code, err)
	}
	return got, err
}

// withReplayTargets adds the pod's replay targets to its status JSON
// (replay_targets), for a replay to see before it hands over a job.
func withReplayTargets(status []byte, specs []string) []byte {
	if len(specs) == 0 {
		return status
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(status, &m) != nil {
		return status
	}
	b, _ := json.Marshal(specs)
	m["replay_targets"] = b
	out, err := json.Marshal(m)
	if err != nil {
		return status
	}
	return out
}
