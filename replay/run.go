package replay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
)

// Work runs a worker on the replay consumer c until ctx is cancelled. Run
// cancels ctx once the replay is complete; Work should then hand back what
// it still holds and return nil (or ctx's error).
type Work func(ctx context.Context, c jetstream.Consumer) error

// Options configure Run. A nil *Options and every zero field mean the
// defaults.
type Options struct {
	// Start is where in MIRROR_JOBS to begin; zero is the beginning.
	Start Start
	// Subjects filter the jobs (Filter.Subjects); empty means every job.
	Subjects []string
	// Consumer gives AckWait and MaxAckPending, as for the live consumer;
	// its Durable and FilterSubjects are not used.
	Consumer *jobs.ConsumerOptions
	// Progress is told how many jobs are handled; nil shows nothing.
	Progress Progress
	// Poll is how often the consumer is asked how far it is
	// (DefaultPoll).
	Poll time.Duration
	// Clock times the polls; nil means the wall clock.
	Clock clock.Clock
	// Logger gets the start and end lines; the zero Logger discards.
	Logger zerolog.Logger
	// Waits, if set, tells the progress what the jobs left wait for once
	// none is being done (a replay beside pods: PodWaits; alone:
	// PacerWaits). Times are shown in Location (nil: time.Local).
	Waits    Waits
	Location *time.Location
	// Await, if set, is waited for before the consumer is created (Lone's
	// wait for an earlier replay): the replay's jobs are those stored when
	// it returns.
	Await func(ctx context.Context) error
}

// Result says what Run did.
type Result struct {
	// Consumer is the name of the ephemeral replay consumer.
	Consumer string
	// LastSeq is the stream's last sequence when the replay began: every
	// selected job up to it was handled.
	LastSeq uint64
	// Jobs is how many jobs the replay had to do: distinct job ids among
	// the selected messages up to LastSeq, the workers' copies not counted
	// (a dry run's Counts.Total for the same selection).
	Jobs int64
	// Elapsed is the time from the consumer's creation to the end.
	Elapsed time.Duration
	// Later is how many jobs stored after LastSeq the consumer delivered
	// and the replay skipped: they are the live workers' to do.
	Later int64
	// Copies is how many messages up to LastSeq were no jobs, skipped: the
	// workers' copies (parked and brought back, continuations, replays'
	// copies) and the earlier messages of a job enqueued again. Each
	// submitted job is replayed once, from its latest message.
	Copies int64
}

// DefaultPoll is the default of Options.Poll: a replay's end is seen
// within a quarter second, and asking the server four times a second for
// one consumer's info costs it nothing worth counting.
const DefaultPoll = 250 * time.Millisecond

// infoPatience is how long Run keeps asking a consumer that does not
// answer before it gives up.
const infoPatience = time.Minute

// InactiveThreshold is how long the server keeps a replay consumer nobody
// pulls from: a replay that dies leaves nothing behind for long.
const InactiveThreshold = 5 * time.Minute

// ConsumerConfig returns the configuration of the ephemeral replay consumer
// named name: the live consumer's (explicit acks, unlimited deliveries, its
// AckWait and MaxAckPending) from start through subjects, replay started at
// now.
func ConsumerConfig(name string, start Start, subjects []string, co *jobs.ConsumerOptions, now time.Time) jetstream.ConsumerConfig {
	var o jobs.ConsumerOptions
	if co != nil {
		o = *co
	}
	o.Durable = name
	o.FilterSubjects = subjects
	cfg := jobs.ConsumerConfig(&o)
	cfg.Durable = "" // ephemeral: removed once idle for InactiveThreshold
	cfg.Name = name
	cfg.Description = "mirrorworker replay " + start.String()
	cfg.InactiveThreshold = InactiveThreshold
	cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = start.deliver(now)
	return cfg
}

// Run replays jobs: it creates an ephemeral consumer on MIRROR_JOBS for
// o.Start and o.Subjects, runs work on it, and returns once every selected
// job stored up to the stream's last sequence at the start has been handled
// (stored, found unchanged, or dead-lettered), or when ctx is done (with
// ctx's error). Jobs stored after the start are not handed to work: the
// consumer work gets skips them (Result.Later counts them), so a replay
// works on the stream as it was when it began and ends however busy the
// stream is. The consumer is deleted before Run returns.
func Run(ctx context.Context, js jetstream.JetStream, work Work, o *Options) (Result, error) {
	if o == nil {
		o = &Options{}
	}
	if err := o.Start.Validate(); err != nil {
		return Result{}, err
	}
	clk := o.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	poll := o.Poll
	if poll <= 0 {
		poll = DefaultPoll
	}
	log := o.Logger
	if o.Await != nil {
		if err := o.Await(ctx); err != nil {
			return Result{}, err
		}
	}

	st, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		return Result{}, fmt.Errorf("replay: stream %s: %w", jobs.JobsStream, err)
	}
	res := Result{Consumer: "mirrorworker_replay_" + nuid.Next(), LastSeq: st.CachedInfo().State.LastSeq}
	began := clk.Now()
	cfg := ConsumerConfig(res.Consumer, o.Start, o.Subjects, o.Consumer, began)
	c, err := js.CreateConsumer(ctx, jobs.JobsStream, cfg)
	if err != nil {
		return res, fmt.Errorf("replay: create consumer: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kvTimeout)
		defer cancel()
		if err := js.DeleteConsumer(dctx, jobs.JobsStream, res.Consumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			log.Warn().Err(err).Str("consumer", res.Consumer).Msg("replay: delete consumer (the server removes it after its inactive threshold)")
		}
	}()
	// The jobs: what the consumer delivers up to LastSeq, less the
	// workers' copies and the earlier messages of a job enqueued again.
	_, byID, err := scanJobs(ctx, js, o.Start, o.Subjects, began, res.LastSeq)
	if err != nil {
		return res, fmt.Errorf("replay: %w", err)
	}
	set := newJobSet(byID)
	res.Jobs, _ = set.counts()
	log.Info().Str("consumer", res.Consumer).Str("start", o.Start.String()).Strs("subjects", cfg.FilterSubjects).
		Str("filter", cfg.FilterSubject).Int64("jobs", res.Jobs).Uint64("last_seq", res.LastSeq).Msg("replay: started")

	if o.Progress != nil {
		o.Progress.Begin(res.Jobs)
		defer o.Progress.End()
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	workErr := make(chan error, 1)
	var skipped, copies atomic.Int64
	go func() {
		workErr <- work(wctx, bounded{Consumer: c, lastSeq: res.LastSeq, jobs: set, skipped: &skipped, copies: &copies})
	}()
	// finish stops the worker and waits for it to hand back what it holds.
	finish := func() error {
		stop()
		err := <-workErr
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		return err
	}

	w := &watch{set: set, o: o, clk: clk, began: began, moved: began}
	t := clk.NewTimer(0)
	defer t.Stop()
	lastInfo := began
	for {
		select {
		case err := <-workErr:
			if ctx.Err() != nil { // the worker saw the stop first
				res.Elapsed = clk.Now().Sub(began)
				return res, ctx.Err()
			}
			if err == nil {
				err = errors.New("the worker stopped before the replay was complete")
			}
			res.Elapsed = clk.Now().Sub(began)
			return res, fmt.Errorf("replay: %w", err)
		case <-ctx.Done():
			_ = finish()
			res.Elapsed = clk.Now().Sub(began)
			return res, ctx.Err()
		case <-t.C():
		}
		info, err := c.Info(ctx)
		if err != nil {
			if ctx.Err() != nil {
				continue // reported by the select
			}
			// A NATS hiccup must not end a long replay; a consumer that is
			// gone, or no answer for a long while, does.
			if !errors.Is(err, jetstream.ErrConsumerNotFound) && clk.Now().Sub(lastInfo) < infoPatience {
				log.Warn().Err(err).Str("consumer", res.Consumer).Msg("replay: consumer info")
				t.Reset(poll)
				continue
			}
			_ = finish()
			res.Elapsed = clk.Now().Sub(began)
			return res, fmt.Errorf("replay: consumer info: %w", err)
		}
		lastInfo = clk.Now()
		if o.Progress != nil {
			w.show(ctx, o.Progress)
		}
		if complete(info, res.LastSeq) {
			err := finish()
			res.Elapsed = clk.Now().Sub(began)
			if err != nil {
				return res, fmt.Errorf("replay: %w", err)
			}
			if o.Progress != nil {
				o.Progress.Set(res.Jobs)
			}
			res.Later, res.Copies = skipped.Load(), copies.Load()
			log.Info().Str("consumer", res.Consumer).Int64("jobs", res.Jobs).Int64("later_jobs_skipped", res.Later).Str("took", res.Elapsed.Round(time.Millisecond).String()).Msg("replay: complete")
			return res, nil
		}
		t.Reset(poll)
	}
}

// watch follows how far a replay is for its progress.
type watch struct {
	set          *jobSet
	o            *Options
	clk          clock.Clock
	began, moved time.Time // moved: when done last grew
	done         int64
	asked        time.Time // when Waits was last asked
	waits        string
}

// waitsEvery is how often a stalled replay asks what its jobs wait for.
const waitsEvery = 2 * time.Second

// show tells p how many jobs are done and, once none is being done, what
// the jobs left wait for.
func (w *watch) show(ctx context.Context, p Progress) {
	now := w.clk.Now()
	_, done := w.set.counts()
	if done > w.done {
		w.done, w.moved = done, now
	}
	p.Set(done)
	if w.o.Waits == nil {
		return
	}
	if !stalled(done, now.Sub(w.began), now.Sub(w.moved)) {
		if w.waits != "" {
			w.waits = ""
			p.Waiting("")
		}
		return
	}
	if now.Sub(w.asked) < waitsEvery {
		return
	}
	w.asked = now
	left := w.set.left()
	auths := make([]string, 0, len(left))
	for a := range left {
		auths = append(auths, a)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	states, err := w.o.Waits(wctx, auths)
	if err != nil {
		w.o.Logger.Debug().Err(err).Msg("replay: what the jobs left wait for")
	}
	loc := w.o.Location
	if loc == nil {
		loc = time.Local
	}
	w.waits = waitLine(left, states, loc)
	p.Waiting(w.waits)
}

// complete reports whether every selected job up to lastSeq was handled:
// acked or terminated, deferred ones included (a job NAKed with a delay
// stays pending until its redelivery). The ack floor says so for a stream
// that is still being written to; with nothing pending and nothing
// outstanding it is true in any case.
func complete(info *jetstream.ConsumerInfo, lastSeq uint64) bool {
	return info.AckFloor.Stream >= lastSeq || info.NumPending == 0 && info.NumAckPending == 0
}
