package facts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// errStalled is what a follower's reader returns when MIRROR_EVENTS holds
// facts it has not delivered for a while (seen after a server restart:
// the ordered consumer, in memory on the server, was gone and not made
// again); Run then follows again from the last fact read.
var errStalled = errors.New("facts stored but not delivered")

// Follow applies to p, as they are published, the pacer facts of every
// other pod and every operator command (pause, resume) on MIRROR_EVENTS,
// skipping those published by self (jobs.HeaderPod), at clk's instant (nil:
// the wall clock). It reads with an ordered consumer from the newest message
// on, so it starts before the cold-start Restore and nothing falls between
// the two; a fact applied twice is harmless. ctx bounds the start only; the
// returned run follows until its own ctx ends; err says Follow could not
// start. NewFollower is the same with Sync.
func Follow(ctx context.Context, js jetstream.JetStream, p Applier, self string, clk clock.Clock, log zerolog.Logger) (run func(ctx context.Context) error, err error) {
	f, err := NewFollower(ctx, js, p, self, clk, log)
	if err != nil {
		return nil, err
	}
	return f.Run, nil
}

// Follower is Follow's reader, with Sync. Run once, or Close it if it is
// not run; Sync is safe for concurrent use.
type Follower struct {
	stream jetstream.Stream
	p      Applier
	self   string
	clk    clock.Clock
	log    zerolog.Logger
	kick   chan struct{} // Sync asks the reader to check it is not stalled

	mu       sync.Mutex
	it       jetstream.MessagesContext // the reader in use
	closed   bool                      // Close called: a new reader is stopped at once
	seen     uint64                    // the stream sequence of the last fact read (applied or skipped)
	progress chan struct{}             // closed and replaced when seen moves
}

// NewFollower starts following MIRROR_EVENTS as Follow does; ctx bounds
// the start only.
func NewFollower(ctx context.Context, js jetstream.JetStream, p Applier, self string, clk clock.Clock, log zerolog.Logger) (*Follower, error) {
	if clk == nil {
		clk = clock.Real{}
	}
	stream, err := js.Stream(ctx, jobs.EventsStream)
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", jobs.EventsStream, err)
	}
	c, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{jobs.PacerEventPrefix + ">"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", jobs.EventsStream, err)
	}
	it, err := c.Messages()
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", jobs.EventsStream, err)
	}
	f := &Follower{stream: stream, it: it, p: p, self: self, clk: clk, log: log,
		kick: make(chan struct{}, 1), progress: make(chan struct{})}
	// What the consumer starts after is the cold-start Restore's, which
	// runs after this: Sync need not wait for it.
	if info, err := c.Info(ctx); err == nil {
		f.seen = info.Delivered.Stream
	} else if last, err := stream.GetLastMsgForSubject(ctx, jobs.PacerEventPrefix+">"); err == nil {
		f.seen = last.Sequence
	}
	return f, nil
}

// Run applies facts until ctx ends, then stops its reader and returns nil.
// A reader that ends, or that leaves facts undelivered for ten seconds (or
// for a second while a Sync waits), is replaced by one that starts after
// the last fact read.
func (f *Follower) Run(ctx context.Context) error {
	defer f.Close()
	// The reader blocks in Next for up to a second: stopping it when ctx
	// ends is what returns Run at once.
	defer context.AfterFunc(ctx, f.Close)()
	for {
		err := f.read(ctx)
		f.mu.Lock()
		closed := f.closed
		f.mu.Unlock()
		if ctx.Err() != nil || closed {
			return nil
		}
		f.mu.Lock()
		after := f.seen
		f.mu.Unlock()
		f.log.Warn().Err(err).Uint64("after", after).Msg("follow pacer facts: following again after the last fact read")
		for ctx.Err() == nil {
			if err = f.reopen(ctx, after+1); err == nil {
				break
			}
			f.log.Warn().Err(err).Msg("follow pacer facts: cannot follow again yet")
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
		}
	}
}

// Close stops the current reader; Run ends with it. It is for a Follower
// that is not run (a start-up that failed after NewFollower).
func (f *Follower) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.it.Stop()
}

// read applies what the current reader delivers until it ends or stalls.
func (f *Follower) read(ctx context.Context) error {
	f.mu.Lock()
	it := f.it
	f.mu.Unlock()
	for idle := 1; ; idle++ {
		m, err := it.Next(jetstream.NextMaxWait(time.Second))
		switch {
		case err == nil:
			idle = 0
			f.apply(m)
			if md, err := m.Metadata(); err == nil {
				f.advance(md.Sequence.Stream)
			}
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return err
		case !errors.Is(err, nats.ErrTimeout):
			f.log.Warn().Err(err).Msg("follow pacer facts")
			continue
		}
		select {
		case <-f.kick:
		default:
			if idle%10 != 0 {
				continue
			}
		}
		if f.behind(ctx) {
			return errStalled
		}
	}
}

// behind reports whether MIRROR_EVENTS holds a fact past the last one read.
func (f *Follower) behind(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	last, err := f.stream.GetLastMsgForSubject(ctx, jobs.PacerEventPrefix+">")
	if err != nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return last.Sequence > f.seen
}

// reopen replaces the reader with one that starts at stream sequence seq.
func (f *Follower) reopen(ctx context.Context, seq uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := f.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{jobs.PacerEventPrefix + ">"},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    seq,
	})
	if err != nil {
		return err
	}
	it, err := c.Messages()
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.it.Stop()
	f.it = it
	if f.closed {
		it.Stop() // closed while this one was being made
	}
	return nil
}

func (f *Follower) apply(m jetstream.Msg) {
	if m.Headers().Get(jobs.HeaderPod) == f.self && f.self != "" {
		return
	}
	var ev pacer.Event
	if err := json.Unmarshal(m.Data(), &ev); err != nil || ev.Authority == "" {
		return
	}
	f.p.Apply(f.clk.Now(), ev)
	if ev.Type == pacer.EventPaused || ev.Type == pacer.EventResumed {
		f.log.Info().Str("authority", ev.Authority).Str("event", string(ev.Type)).
			Time("until", ev.Until).Str("reason", ev.Reason).Msg("operator " + string(ev.Type) + " authority")
	}
}

func (f *Follower) advance(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if seq > f.seen {
		f.seen = seq
		close(f.progress)
		f.progress = make(chan struct{})
	}
}

// Sync returns once every fact MIRROR_EVENTS had stored when Sync was
// called has been applied (or skipped as this pod's own), or with ctx's
// error: what a pod taking a partition over waits for before serving it,
// so that every wait another pod published before the take binds it.
func (f *Follower) Sync(ctx context.Context) error {
	last, err := f.stream.GetLastMsgForSubject(ctx, jobs.PacerEventPrefix+">")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil // no fact at all
	case err != nil:
		return fmt.Errorf("sync pacer facts: %w", err)
	}
	nudge := time.NewTimer(time.Second)
	defer nudge.Stop()
	for {
		f.mu.Lock()
		seen, progress := f.seen, f.progress
		f.mu.Unlock()
		if seen >= last.Sequence {
			return nil
		}
		select {
		case <-progress:
		case <-nudge.C:
			// Not there within a second: have the reader check that it
			// is not stalled (and replaced if it is).
			select {
			case f.kick <- struct{}{}:
			default:
			}
			nudge.Reset(time.Second)
		case <-ctx.Done():
			return fmt.Errorf("sync pacer facts: applied up to %d of %d: %w", seen, last.Sequence, ctx.Err())
		}
	}
}
