package facts_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/rs/zerolog"
)

// stamped is an Applier that remembers each fact with the instant it was
// applied at; safe for concurrent use.
type stamped struct {
	mu  sync.Mutex
	got []pacer.Event
	at  []time.Time
}

func (s *stamped) Apply(now time.Time, ev pacer.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got, s.at = append(s.got, ev), append(s.at, now)
}

func (s *stamped) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// TestFollowAppliesOthersFactsOnItsClock: Follow applies the operator's
// pause and another pod's cooldown at the injected clock's instant, and
// skips the facts its own pod published.
func TestFollowAppliesOthersFactsOnItsClock(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	virtual := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clock.NewFake(virtual)
	var r stamped
	fctx, stop := context.WithCancel(ctx)
	run, err := facts.Follow(ctx, js, &r, "pod-a", clk, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run(fctx) }()

	const auth = "origin.example:443"
	now := time.Now()
	own := facts.NewSink(js, zerolog.Nop(), nil)
	own.SetPod("pod-a")
	other := facts.NewSink(js, zerolog.Nop(), nil)
	other.SetPod("pod-b")
	sctx, stopSinks := context.WithCancel(ctx)
	var sinks sync.WaitGroup
	for _, s := range []*facts.Sink{own, other} {
		sinks.Add(1)
		go func() { defer sinks.Done(); s.Run(sctx) }()
	}
	own.Handle(pacer.Event{Type: pacer.EventCooldown, Authority: auth, At: now, Until: now.Add(time.Minute)})
	pause := pacer.Event{Type: pacer.EventPaused, Authority: auth, At: now, Until: now.Add(time.Hour), Reason: "maintenance"}
	if err := facts.PublishOperator(ctx, js, pause); err != nil {
		t.Fatal(err)
	}
	other.Handle(pacer.Event{Type: pacer.EventCooldown, Authority: auth, At: now, Until: now.Add(2 * time.Minute)})

	deadline := time.Now().Add(30 * time.Second)
	for r.len() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
	stopSinks()
	sinks.Wait()
	stop()
	if err := <-done; err != nil {
		t.Fatalf("follow returned %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) != 2 {
		t.Fatalf("applied %d facts, want 2 (the operator's pause, pod-b's cooldown): %+v", len(r.got), r.got)
	}
	if r.got[0].Type != pacer.EventPaused || !r.got[0].Until.Equal(pause.Until) || r.got[0].Reason != "maintenance" {
		t.Errorf("first fact = %+v, want the operator's pause", r.got[0])
	}
	if r.got[1].Type != pacer.EventCooldown || !r.got[1].Until.Equal(now.Add(2*time.Minute)) {
		t.Errorf("second fact = %+v, want pod-b's cooldown (pod-a's own is skipped)", r.got[1])
	}
	for i, at := range r.at {
		if !at.Equal(virtual) {
			t.Errorf("fact %d applied at %s, want the injected clock's %s", i, at, virtual)
		}
	}
}

func TestPublishOperatorRefusesOtherFacts(t *testing.T) {
	for _, ev := range []pacer.Event{
		{Type: pacer.EventCooldown, Authority: "a.example:443"},
		{Type: pacer.EventPaused},
	} {
		if err := facts.PublishOperator(context.Background(), nil, ev); err == nil {
			t.Errorf("PublishOperator(%+v) = nil, want an error", ev)
		}
	}
}

// slowApplier applies each fact slowly, as a busy pod might.
type slowApplier struct{ stamped }

func (s *slowApplier) Apply(now time.Time, ev pacer.Event) {
	time.Sleep(150 * time.Millisecond)
	s.stamped.Apply(now, ev)
}

// TestFollowerSyncWaitsForStoredFacts: Sync returns only once every fact
// stored before it was called has been applied, however slowly the
// follower applies them; with nothing new stored since the follower
// started (what was stored before is the cold-start restore's) it returns
// at once.
func TestFollowerSyncWaitsForStoredFacts(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	if err := facts.PublishOperator(ctx, js, pacer.Event{Type: pacer.EventPaused, Authority: "before.example:443", At: time.Now(), Until: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	var r slowApplier
	fctx, stop := context.WithCancel(ctx)
	f, err := facts.NewFollower(ctx, js, &r, "pod-a", nil, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	defer func() { stop(); <-done }()
	sctx0, cancel0 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel0()
	if err := f.Sync(sctx0); err != nil {
		t.Fatalf("Sync with nothing stored since the start: %v", err)
	}
	other := facts.NewSink(js, zerolog.Nop(), nil)
	other.SetPod("pod-b")
	sctx, stopSink := context.WithCancel(ctx)
	sinkDone := make(chan error, 1)
	go func() { sinkDone <- other.Run(sctx) }()
	defer func() { stopSink(); <-sinkDone }()
	const n = 4
	for i := range n {
		other.Handle(pacer.Event{Type: pacer.EventInterval, Authority: "origin.example:443", At: time.Now(), Interval: time.Duration(i+1) * time.Second})
	}
	if err := other.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.len(); got != n {
		t.Fatalf("Sync returned with %d of the %d stored facts applied", got, n)
	}
}

// TestFollowerFollowsAcrossAServerRestart: the server is shut down and
// started again on its store (the follower's consumer, kept in memory, is
// gone); a fact published after the restart is applied, and Sync returns.
func TestFollowerFollowsAcrossAServerRestart(t *testing.T) {
	dir := t.TempDir()
	e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(e.ClientURL(), "nats://")
	nc, err := nats.Connect(e.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := brokertest.Context(t)
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	var r stamped
	fctx, stop := context.WithCancel(ctx)
	f, err := facts.NewFollower(ctx, js, &r, "pod-a", nil, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	defer func() { stop(); <-done }()

	e.Shutdown()
	e, err = broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: dir, Listen: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	other, err := e.Connect("pod-b")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ojs, _ := jetstream.New(other)
	if err := facts.PublishOperator(ctx, ojs, pacer.Event{Type: pacer.EventPaused, Authority: "after.example:443", At: time.Now(), Until: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := f.Sync(sctx); err != nil {
		t.Fatalf("Sync after the restart: %v", err)
	}
	if r.len() != 1 {
		t.Fatalf("%d facts applied after the restart, want 1", r.len())
	}
}
