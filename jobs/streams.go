package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Names of the JetStream assets mirrorworker uses.
const (
	JobsStream     = "MIRROR_JOBS"     // subjects mirror.jobs.>
	DLQStream      = "MIRROR_DLQ"      // subjects mirror.dlq.>
	EventsStream   = "MIRROR_EVENTS"   // subjects mirror.events.>
	AttemptsBucket = "MIRROR_ATTEMPTS" // KV: failure budget per job id
	ConsumerName   = "mirrorworker"    // the durable pull consumer on JobsStream
)

// Stream defaults (docs/contract.md sections 2 and 6).
const (
	DefaultJobsMaxAge       = 7 * 24 * time.Hour
	DefaultJobsDuplicates   = 2 * time.Minute
	DefaultDLQMaxAge        = 30 * 24 * time.Hour
	DefaultDLQDuplicates    = 2 * time.Minute
	DefaultEventsMaxAge     = 24 * time.Hour
	DefaultEventsPerSubject = 10000
	// MinEventsMaxAge is the least history a cold start must be able to
	// replay: the longest pause (600 s) and the 30 min decay window.
	MinEventsMaxAge = time.Hour
)

// StreamOptions sizes the streams and the KV bucket. A nil *StreamOptions
// and every zero field mean the defaults; a MaxBytes of 0 means unlimited.
type StreamOptions struct {
	// Replicas of every stream and of the bucket. 0 means 1 for what is
	// created and the replicas already in force for what exists, so that a
	// command that does not say leaves a replicated stream replicated.
	Replicas int

	JobsMaxAge     time.Duration // default 7 days
	JobsMaxBytes   int64
	JobsDuplicates time.Duration // the Nats-Msg-Id window, default 2 minutes

	DLQMaxAge   time.Duration // default 30 days
	DLQMaxBytes int64

	EventsMaxAge   time.Duration // default 24 h, at least MinEventsMaxAge
	EventsMaxBytes int64
	// EventsPerSubject bounds the facts kept per authority (oldest dropped);
	// default 10000, negative means unlimited.
	EventsPerSubject int64

	// AttemptsTTL is how long a job's failure counter lives; default the
	// jobs' MaxAge, so a counter outlives every delivery of its job.
	AttemptsTTL time.Duration

	// Partitions is how many partitions the MIRROR_JOBS subject transform
	// spreads authorities over (docs/adr/0007); 0 keeps an existing
	// stream's and gives a new one DefaultPartitions. It is fixed once the
	// stream holds partitioned jobs: asking for another count is an error.
	Partitions int

	// KeepExisting makes EnsureStreams create what is missing and leave an
	// existing stream or bucket as it is, except that a Replicas above its
	// own raises it. Producers such as enqueue set it: they do not know the
	// limits the operator gave the worker and must not reset them to the
	// defaults, but they must not leave jobs on fewer replicas than asked.
	KeepExisting bool
}

func (o *StreamOptions) withDefaults() StreamOptions {
	var r StreamOptions
	if o != nil {
		r = *o
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&r.JobsMaxAge, DefaultJobsMaxAge)
	def(&r.JobsDuplicates, DefaultJobsDuplicates)
	def(&r.DLQMaxAge, DefaultDLQMaxAge)
	def(&r.EventsMaxAge, DefaultEventsMaxAge)
	def(&r.AttemptsTTL, r.JobsMaxAge)
	if r.Replicas == 0 {
		r.Replicas = 1
	}
	if r.EventsPerSubject == 0 {
		r.EventsPerSubject = DefaultEventsPerSubject
	}
	if r.Partitions <= 0 {
		r.Partitions = DefaultPartitions
	}
	return r
}

func unlimited(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// StreamConfigs returns the configurations of MIRROR_JOBS, MIRROR_DLQ and
// MIRROR_EVENTS, in that order, or an error for options that make no sense.
func StreamConfigs(o *StreamOptions) ([]jetstream.StreamConfig, error) {
	r := o.withDefaults()
	switch {
	case r.Replicas < 0:
		return nil, fmt.Errorf("stream options: replicas %d", r.Replicas)
	case r.JobsMaxAge < 0, r.DLQMaxAge < 0, r.EventsMaxAge < 0, r.JobsDuplicates < 0, r.AttemptsTTL < 0:
		return nil, errors.New("stream options: negative duration")
	case r.JobsDuplicates > r.JobsMaxAge:
		return nil, fmt.Errorf("stream options: duplicate window %s is longer than the jobs max age %s", r.JobsDuplicates, r.JobsMaxAge)
	case r.EventsMaxAge < MinEventsMaxAge:
		return nil, fmt.Errorf("stream options: events max age %s is shorter than %s, too short to rebuild the pacer after a cold start", r.EventsMaxAge, MinEventsMaxAge)
	}
	perSubject := r.EventsPerSubject
	if perSubject < 0 {
		perSubject = -1
	}
	return []jetstream.StreamConfig{
		{
			Name:        JobsStream,
			Description: "mirrorworker jobs (kept after ack for replay)",
			Subjects:    []string{JobsSubjectPrefix + ">"},
			// Limits, not WorkQueue: acked jobs stay so the stream can be replayed.
			Retention:  jetstream.LimitsPolicy,
			Storage:    jetstream.FileStorage,
			MaxAge:     r.JobsMaxAge,
			MaxBytes:   unlimited(r.JobsMaxBytes),
			MaxMsgs:    -1,
			MaxMsgSize: MaxJobLen,
			Duplicates: r.JobsDuplicates,
			// DiscardNew: when MaxBytes is reached a publish fails visibly.
			// DiscardOld would silently drop the oldest jobs, acked or not,
			// and a job must leave only as a stored object or a dead letter.
			Discard:  jetstream.DiscardNew,
			Replicas: r.Replicas,
			// Each job is stored with its authority's partition as a fifth
			// token, so that one consumer per partition reads the stream
			// itself: no copy, and no job waits behind another
			// partition's backlog. Producers publish four tokens.
			SubjectTransform: &jetstream.SubjectTransformConfig{
				Source:      JobsSubjectPrefix + "*.*",
				Destination: jobsTransformDest(max(r.Partitions, 1)),
			},
		},
		{
			Name:        DLQStream,
			Description: "mirrorworker dead-letter records",
			Subjects:    []string{DLQSubjectPrefix + ">"},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			MaxAge:      r.DLQMaxAge,
			MaxBytes:    unlimited(r.DLQMaxBytes),
			MaxMsgs:     -1,
			Duplicates:  min(DefaultDLQDuplicates, r.DLQMaxAge),
			Discard:     jetstream.DiscardNew, // as for jobs: a dead letter is the job's last trace
			Replicas:    r.Replicas,
		},
		{
			Name:        EventsStream,
			Description: "mirrorworker pacer facts, replayed after a cold start",
			Subjects:    []string{EventsSubjectPrefix + ">"},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			MaxAge:      r.EventsMaxAge,
			MaxBytes:    unlimited(r.EventsMaxBytes),
			MaxMsgs:     -1,
			// Old facts are superseded by newer ones: dropping the oldest is right here.
			MaxMsgsPerSubject: perSubject,
			Discard:           jetstream.DiscardOld,
			Replicas:          r.Replicas,
		},
	}, nil
}

// AttemptsConfig returns the configuration of the MIRROR_ATTEMPTS bucket:
// one key per job id holding the worker's count of failed attempts.
func AttemptsConfig(o *StreamOptions) jetstream.KeyValueConfig {
	r := o.withDefaults()
	return jetstream.KeyValueConfig{
		Bucket:      AttemptsBucket,
		Description: "mirrorworker failure budget per job id",
		History:     1,
		TTL:         r.AttemptsTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    r.Replicas,
	}
}

// EnsureStreams creates or updates MIRROR_JOBS, MIRROR_DLQ, MIRROR_EVENTS and
// the MIRROR_ATTEMPTS bucket (with KeepExisting: only creates what is
// missing, and raises replicas). It is idempotent; changed limits are
// applied to existing streams.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o *StreamOptions) error {
	cfgs, err := StreamConfigs(o)
	if err != nil {
		return err
	}
	keep := o != nil && o.KeepExisting
	asked := 0
	if o != nil {
		asked = o.Replicas
	}
	for _, cfg := range cfgs {
		existing, err := js.Stream(ctx, cfg.Name)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("stream %s: %w", cfg.Name, err)
		}
		if existing != nil && asked == 0 {
			cfg.Replicas = existing.CachedInfo().Config.Replicas
		}
		if cfg.Name == JobsStream && existing != nil {
			// The partition count is the stream's once it has one.
			if have, err := PartitionsOf(existing.CachedInfo().Config); err == nil {
				if o != nil && o.Partitions > 0 && o.Partitions != have {
					return fmt.Errorf("stream %s spreads jobs over %d partitions; --partitions %d cannot change that (leave --partitions unset, or start with a new stream)", JobsStream, have, o.Partitions)
				}
				cfg.SubjectTransform.Destination = jobsTransformDest(have)
			}
		}
		if keep {
			if existing != nil {
				if err := raiseReplicas(ctx, js, existing.CachedInfo().Config, asked); err != nil {
					return err
				}
				continue
			}
			_, err := js.CreateStream(ctx, cfg)
			if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // lost a race: fine
				return fmt.Errorf("create stream %s: %w", cfg.Name, err)
			}
			continue
		}
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
		}
	}
	kv := AttemptsConfig(o)
	// A bucket is the stream KV_<bucket>; its replicas are that stream's.
	kvStream, err := js.Stream(ctx, "KV_"+kv.Bucket)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("bucket %s: %w", kv.Bucket, err)
	}
	if kvStream != nil && asked == 0 {
		kv.Replicas = kvStream.CachedInfo().Config.Replicas
	}
	if keep {
		if kvStream != nil {
			return raiseReplicas(ctx, js, kvStream.CachedInfo().Config, asked)
		}
		if _, err := js.CreateKeyValue(ctx, kv); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("create bucket %s: %w", kv.Bucket, err)
		}
		return nil
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, kv); err != nil {
		return fmt.Errorf("create or update bucket %s: %w", kv.Bucket, err)
	}
	return nil
}

// raiseReplicas updates the stream of cfg to n replicas when it has fewer,
// changing nothing else.
func raiseReplicas(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, n int) error {
	if n <= cfg.Replicas {
		return nil
	}
	cfg.Replicas = n
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("raise stream %s to %d replicas: %w", cfg.Name, n, err)
	}
	// The stream is moved to a new peer group: publishes time out until it
	// has a leader and its new replicas have caught up.
	for {
		s, err := js.Stream(ctx, cfg.Name)
		if err == nil {
			if c := s.CachedInfo().Cluster; c != nil && c.Leader != "" && len(c.Replicas) == n-1 && allCurrent(c.Replicas) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("raise stream %s to %d replicas: waiting for its replicas: %w", cfg.Name, n, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func allCurrent(peers []*jetstream.PeerInfo) bool {
	for _, p := range peers {
		if !p.Current {
			return false
		}
	}
	return true
}

// Consumer defaults.
const (
	DefaultAckWait       = 60 * time.Second
	DefaultMaxAckPending = 20000
)

// ConsumerOptions configures the durable pull consumer. A nil
// *ConsumerOptions and every zero field mean the defaults.
type ConsumerOptions struct {
	// Durable is the consumer name; default ConsumerName. Workers that share
	// it share the work.
	Durable string
	// FilterSubjects narrows the consumer (for example to a partition of
	// authorities, see JobsSubjectFilter); default mirror.jobs.>.
	FilterSubjects []string
	// AckWait is how long a delivered job may stay unacked before it is
	// redelivered; the worker extends it with in-progress acks. Default 60 s.
	AckWait time.Duration
	// MaxAckPending bounds delivered but unacked jobs, deferred ones
	// included; default 20000.
	MaxAckPending int
	// Replicas of the consumer; 0 inherits the stream's.
	Replicas int
}

// ConsumerConfig returns the configuration of the durable pull consumer on
// MIRROR_JOBS.
func ConsumerConfig(o *ConsumerOptions) jetstream.ConsumerConfig {
	var r ConsumerOptions
	if o != nil {
		r = *o
	}
	if r.Durable == "" {
		r.Durable = ConsumerName
	}
	if r.AckWait <= 0 {
		r.AckWait = DefaultAckWait
	}
	if r.MaxAckPending <= 0 {
		r.MaxAckPending = DefaultMaxAckPending
	}
	cfg := jetstream.ConsumerConfig{
		Name:          r.Durable,
		Durable:       r.Durable,
		Description:   "mirrorworker job consumer",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		ReplayPolicy:  jetstream.ReplayInstantPolicy,
		AckWait:       r.AckWait,
		// Unlimited on purpose. Every redelivery, a NAK with delay included,
		// counts toward MaxDeliver, and a job deferred because its authority
		// is cooling or spacing requests may be redelivered many times
		// without ever failing. With a finite MaxDeliver the server would
		// stop delivering such a job (only an advisory says so): it would be
		// neither stored nor dead-lettered. The failure budget
		// (docs/contract.md section 5) is counted by the worker in the MIRROR_ATTEMPTS
		// bucket instead, where only real failures count.
		MaxDeliver:    -1,
		MaxAckPending: r.MaxAckPending,
		Replicas:      r.Replicas,
	}
	switch len(r.FilterSubjects) {
	case 0:
		cfg.FilterSubject = JobsSubjectPrefix + ">"
	case 1:
		cfg.FilterSubject = r.FilterSubjects[0]
	default:
		cfg.FilterSubjects = append([]string(nil), r.FilterSubjects...)
	}
	return cfg
}

// EnsureConsumer creates or updates the durable pull consumer on MIRROR_JOBS.
// The stream must exist (EnsureStreams).
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, o *ConsumerOptions) (jetstream.Consumer, error) {
	cfg := ConsumerConfig(o)
	c, err := js.CreateOrUpdateConsumer(ctx, JobsStream, cfg)
	if err != nil {
		return nil, fmt.Errorf("create or update consumer %s: %w", cfg.Durable, err)
	}
	return c, nil
}
