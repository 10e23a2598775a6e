package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/cluster"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/grant"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/lifecycle"
	"github.com/mirrorworker/mirrorworker/policy"
	"github.com/mirrorworker/mirrorworker/worker"
)

// PodOptions say how StartPod binds a worker to MIRROR_JOBS. The zero value
// of a field is its default.
type PodOptions struct {
	// Partitions > 0 selects the partitioned layout (docs/adr/0007): the
	// worker serves the partitions whose lease this pod holds; 0 is the
	// single shared consumer, for one pod only.
	Partitions int
	Consumer   *jobs.ConsumerOptions // the consumers' settings (AckWait, MaxAckPending, replicas)
	LeaseTTL   time.Duration         // jobs.WorkOptions.LeaseTTL
	Replicas   int                   // of the work streams and buckets
	// ParkAfter and LaneBacklog are worker.Options' (partitioned only).
	ParkAfter   time.Duration
	LaneBacklog int
	PodID       string // the lease holder's name; Config.WorkerID
	Version     string // in the pod's status (MIRROR_PODS)
	Target      worker.Target
	// ReplayTargets are the targets the pod stores replay jobs into (its
	// own and the allowed ones); nil: the pod takes no replay jobs.
	ReplayTargets *ReplayTargets
	// ShutdownGrace is worker.Options.ShutdownGrace.
	ShutdownGrace time.Duration
	// Adjust, if set, changes the worker's options and dependencies last
	// (a fetcher wrapped, a fault hook for crash tests).
	Adjust func(*worker.Options, *worker.Deps)
	Logger zerolog.Logger
}

// Pod is a worker bound to MIRROR_JOBS with what serves it: in the
// partitioned layout the lease manager and the follower of the other pods'
// pacer facts. Run it once.
type Pod struct {
	Worker *worker.Worker
	// Partitions is the stream's partition count (0: the shared consumer).
	Partitions int

	parts  *Parts
	mgr    *cluster.Manager // nil with the shared consumer
	follow *facts.Follower  // nil with the shared consumer
	// grants grants starts from the pod's pacer to other programs, for
	// the authorities the pod serves (issue 37, docs/contract.md "Grants").
	grants *grant.Server
	policy *policy.Watcher // the live policy (MIRROR_POLICY)
	replay []string        // the replay targets, in the status
	log    zerolog.Logger
	// What the pod's entry in MIRROR_PODS is made of and lives by
	// (lonereplay.go): written by the lease manager, or by announce with
	// the shared consumer.
	id, version string
	leaseTTL    time.Duration
	replicas    int
}

// StartPod binds a worker to MIRROR_JOBS, in the order a pod must start:
// the live policy (MIRROR_POLICY loaded into the pacer, then followed by
// Run: docs/adr/0023), the consumers (EnsureWork with its partitions, or the shared consumer),
// the follower of MIRROR_EVENTS (before the restore, so that no fact falls
// between the two), the cold-start restore of the pacer (a read error is
// fatal: starting without it would be ruder than before), the worker with
// its partition options, and the lease manager whose hooks add and remove
// the worker's partitions. The streams must exist (jobs.EnsureStreams).
func (p *Parts) StartPod(ctx context.Context, o *PodOptions) (*Pod, error) {
	js := p.js
	pod := &Pod{parts: p, log: o.Logger, id: o.PodID, version: o.Version, leaseTTL: o.LeaseTTL, replicas: o.Replicas}
	var cons jetstream.Consumer
	var err error
	// The live policy (MIRROR_POLICY, docs/adr/0023) over Config.Policy,
	// loaded into the pacer before anything can send a request.
	if pod.policy, err = policy.Open(ctx, js, policy.Options{Base: p.cfg.Policy, Apply: p.SetPolicy,
		Replicas: o.Replicas, Registerer: p.cfg.Registerer, Logger: o.Logger}); err != nil {
		return nil, fmt.Errorf("live policy: %w", err)
	}
	if o.Partitions > 0 {
		if err := jobs.CheckServer(js.Conn()); err != nil {
			return nil, err
		}
		wo := jobs.WorkOptions{LeaseTTL: o.LeaseTTL, Replicas: o.Replicas, Consumer: o.Consumer}
		if pod.Partitions, err = jobs.EnsureWork(ctx, js, &wo); err != nil {
			return nil, fmt.Errorf("ensure work streams: %w", err)
		}
		if pod.follow, err = p.Follow(ctx, js, o.PodID, o.Logger); err != nil {
			return nil, err
		}
	} else if cons, err = jobs.EnsureConsumer(ctx, js, o.Consumer); err != nil {
		return nil, fmt.Errorf("ensure consumer: %w", err)
	}
	if _, err := facts.Restore(ctx, js, p.Pacer, facts.RestoreOptions{Logger: o.Logger}); err != nil {
		pod.stopFollow()
		return nil, fmt.Errorf("restore pacer state: %w", err)
	}
	var mgrp atomic.Pointer[cluster.Manager] // set once the manager is built
	pod.Worker, err = p.NewWorker(cons, o.Target, o.ShutdownGrace, func(wo *worker.Options, d *worker.Deps) {
		if pod.Partitions > 0 {
			wo.Partitions, wo.ParkAfter, wo.LaneBacklog = pod.Partitions, o.ParkAfter, o.LaneBacklog
			if legacy, err := js.Consumer(ctx, jobs.JobsStream, jobs.ConsumerName); err == nil {
				d.Legacy = legacy // EnsureWork narrowed it to the unpartitioned jobs
			}
			d.Owns = func(p int) bool { m := mgrp.Load(); return m != nil && m.Owns(p) }
		}
		if o.ReplayTargets != nil {
			d.ReplayTarget = (&replayOpener{js: js, targets: o.ReplayTargets, clk: p.Clock}).open
			pod.replay = o.ReplayTargets.Specs()
		}
		if o.Adjust != nil {
			o.Adjust(wo, d)
		}
	})
	if err != nil {
		pod.stopFollow()
		return nil, err
	}
	pod.grants = grant.NewServer(js.Conn(), p.Pacer, &grant.Options{
		// A grant is a start of this pacer like the worker's own, made only
		// while the worker serves the authority's partition, fenced from its
		// take-over like the worker's first request.
		Owns: func(auth string) bool {
			_, ok := pod.Worker.GrantOwns(p.Clock.Now(), auth)
			return ok
		},
		// Live jobs first: a grant takes at most one start in four while
		// the pod's live jobs for the authority wait (docs/adr/0025).
		Defer: func(auth string) time.Duration { return pod.Worker.GrantLiveFirst(p.Clock.Now(), auth) },
		ID:    o.PodID, Clock: p.Clock, Logger: o.Logger,
	})
	if pod.Partitions > 0 {
		if pod.mgr, err = pod.newManager(ctx, o); err != nil {
			pod.stopFollow()
			return nil, err
		}
		mgrp.Store(pod.mgr)
	}
	return pod, nil
}

func (pod *Pod) stopFollow() {
	if pod.follow != nil {
		pod.follow.Close()
	}
}

// Owned returns the partitions this pod serves (none with the shared
// consumer).
func (pod *Pod) Owned() []int {
	if pod.mgr == nil {
		return nil
	}
	return pod.mgr.Owned()
}

// Run runs the pod in its own group (NewGroup, Add) until ctx ends, and
// stops it in the pipeline's order. It returns nil after a stop asked for
// by ctx; a worker that stops on its own is an error.
func (pod *Pod) Run(ctx context.Context) error {
	g := NewGroup(pod.log)
	if err := pod.Add(ctx, g); err != nil {
		if ctx.Err() != nil {
			return nil // a stop asked for during start-up
		}
		return err
	}
	return g.Run(ctx)
}

// Add adds the pod's parts to g at their stages (StageAdmission): the
// worker; the event sink and, in the partitioned layout, the lease manager
// (trailing: pacer facts learned while stopping are still published, and
// leases kept until every held job is handed back); the follower, the grant
// server and the live policy (services). ctx bounds what Add itself does
// (the pods bucket). It returns lifecycle.ErrStopping if g's stop had
// already passed their stages.
func (pod *Pod) Add(ctx context.Context, g *lifecycle.Group) error {
	ro := &RunOptions{}
	if mgr := pod.mgr; mgr != nil {
		ro.Stopping = mgr.StopTaking // a stopping pod takes no partition another pod just gave up
		ro.Trailing = append(ro.Trailing, func(mctx context.Context) error {
			// Leases are taken once the worker pulls, so that a partition
			// taken is served at once.
			select {
			case <-pod.Worker.Pulling():
			case <-mctx.Done():
			}
			err := mgr.Run(mctx)
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// Every fact learned is stored before the leases go (the sink
			// keeps publishing for facts.StopWindow after the stop).
			if ferr := pod.parts.Sink.Flush(cctx); ferr != nil {
				pod.log.Warn().Err(ferr).Msg("leases given up with pacer facts not yet stored")
			}
			if cerr := mgr.Close(cctx); cerr != nil {
				pod.log.Warn().Err(cerr).Msg("give up leases at exit (they expire by themselves)")
			}
			return err
		})
	}
	if pod.follow != nil {
		ro.Services = append(ro.Services, pod.follow.Run)
	}
	ro.Services = append(ro.Services, pod.grants.Run, pod.policy.Run)
	pods, err := pod.podsBucket(ctx)
	if err != nil {
		if ctx.Err() != nil {
			pod.stopFollow()
			return lifecycle.ErrStopping // a stop asked for during start-up
		}
		// Not fatal: the pod works, but a replay beside it may not see it.
		pod.log.Warn().Err(err).Msg("the pod cannot announce itself: a replay beside it may not see it, and pace its own requests")
	}
	if pod.mgr == nil && pods != nil {
		// With the shared consumer the pod announces itself, until its
		// worker has stopped (lonereplay.go).
		ro.Trailing = append(ro.Trailing, func(tctx context.Context) error {
			pod.announce(tctx, pods)
			return nil
		})
	}
	err = pod.parts.Add(g, func(wctx context.Context) error {
		// A replay pacing alone stops before this pod takes work.
		pod.awaitLoneReplays(wctx, pods)
		if wctx.Err() != nil {
			return nil
		}
		err := pod.Worker.Run(wctx)
		switch {
		case err != nil:
			return fmt.Errorf("worker: %w", err)
		case wctx.Err() == nil:
			return errors.New("worker: stopped on its own")
		}
		return nil
	}, ro)
	if err != nil && pod.follow != nil {
		pod.follow.Close() // in case its Run was not added
	}
	return err
}

// newManager builds the lease manager of a partitioned pod: a partition
// taken gets its consumer and is added to the worker; one given up is
// removed (its jobs handed back, its requests ended) before the lease goes.
func (pod *Pod) newManager(ctx context.Context, o *PodOptions) (*cluster.Manager, error) {
	js := pod.parts.js
	leases, err := js.KeyValue(ctx, jobs.LeasesBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", jobs.LeasesBucket, err)
	}
	pods, err := js.KeyValue(ctx, jobs.PodsBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", jobs.PodsBucket, err)
	}
	hooks := &podHooks{pod: pod, consOpts: o.Consumer}
	return cluster.New(cluster.KV{KeyValue: leases}, cluster.KV{KeyValue: pods}, hooks, cluster.Options{
		PodID: o.PodID, Partitions: pod.Partitions, TTL: o.LeaseTTL, Logger: o.Logger,
		Link:  broker.NewLink(js.Conn()).Up, // Owns is false while the connection is down
		Clock: pod.parts.Clock,              // its take-over instants fence the worker's pacer, read on the same clock
	})
}

// Serving is the pod's part of readiness: nil when it holds its share of
// the partitions (or stands by with every partition held), or with the
// shared consumer; else why not (cluster.Manager.Serving, docs/adr/0007).
func (pod *Pod) Serving() error {
	if pod.mgr == nil {
		return nil
	}
	return pod.mgr.Serving()
}

// podHooks connect the lease manager to the worker.
type podHooks struct {
	pod      *Pod
	consOpts *jobs.ConsumerOptions
}

var _ cluster.Hooks = (*podHooks)(nil)

// Acquired binds p's consumer and, meanwhile, waits until every pacer fact
// stored before the take has been applied (docs/adr/0007): a wait another
// pod published binds this pod's first request to the authority. Then the
// worker serves p, fenced from since.
func (h *podHooks) Acquired(ctx context.Context, p int, since time.Time) error {
	synced := make(chan error, 1)
	go func() { synced <- h.pod.parts.SyncFacts(ctx) }()
	// EnsureWork created every partition's consumer; bind to it (and
	// apply changed settings).
	c, err := jobs.EnsurePartitionConsumer(ctx, h.pod.parts.js, p, h.consOpts, 0)
	if serr := <-synced; err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return err
	}
	return h.pod.Worker.AddPartition(p, c, since)
}

// Release ends p's requests, then waits until every pacer fact learned
// from them is stored on MIRROR_EVENTS, so that the pod that takes p next
// finds them (its Acquired syncs): only then is the lease given up. If
// that does not happen within ctx the lease is still given up; the facts
// are published as soon as the link allows.
func (h *podHooks) Release(ctx context.Context, p int) {
	// Owns refuses p now, so no new grant is made for it; the grants still
	// out are revoked (their starts, made before the lease goes, are
	// covered by the next owner's take-over fence).
	if n := h.pod.grants.Revoke(func(auth string) bool { return h.pod.Worker.PartitionOf(auth) == p }); n > 0 {
		h.pod.log.Debug().Int("partition", p).Int("grants", n).Msg("grants revoked with the partition")
	}
	h.pod.Worker.RemovePartition(ctx, p)
	if err := h.pod.parts.Sink.Flush(ctx); err != nil {
		h.pod.log.Warn().Err(err).Int("partition", p).Msg("partition released with pacer facts not yet stored (they are published once the link allows)")
	}
}

func (h *podHooks) Status() []byte { return h.pod.status() }
