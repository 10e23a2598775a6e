package replay_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// liveWorker is the worker as `mirrorworker run` wires it: the durable
// consumer, a pacer whose facts go through the event sink to MIRROR_EVENTS,
// and (when restore is set) the pacer rebuilt from MIRROR_EVENTS first.
type liveWorker struct {
	stop     context.CancelFunc
	stopSink context.CancelFunc
	done     chan error
	sinkDone chan error
}

func startLiveWorker(t *testing.T, js jetstream.JetStream, root string, restore bool) *liveWorker {
	t.Helper()
	ctx := brokertest.Context(t)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	cons, err := jobs.EnsureConsumer(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := worker.NewMetrics(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	sink := facts.NewSink(js, log, metrics)
	pc := pacer.New(&pacer.Options{Policy: testPolicy(), OnEvent: sink.Handle})
	if restore {
		if _, err := facts.Restore(ctx, js, pc, facts.RestoreOptions{Logger: log}); err != nil {
			t.Fatal(err)
		}
	}
	target, err := mirror.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	fc := fetch.New(&fetch.Options{AllowPrivate: true})
	t.Cleanup(fc.CloseIdleConnections)
	w, err := worker.New(worker.Deps{JS: js, Consumer: cons, Fetcher: fc, Target: target, Pacer: pc}, &worker.Options{
		Concurrency: 4, Metrics: metrics, Logger: log, ShutdownGrace: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	lw := &liveWorker{done: make(chan error, 1), sinkDone: make(chan error, 1)}
	wctx, stop := context.WithCancel(context.Background())
	sctx, stopSink := context.WithCancel(context.Background())
	lw.stop, lw.stopSink = stop, stopSink
	go func() { lw.sinkDone <- sink.Run(sctx) }()
	go func() { lw.done <- w.Run(wctx) }()
	t.Cleanup(lw.shutdown)
	return lw
}

// shutdown stops the worker, then the sink (which flushes its facts).
func (lw *liveWorker) shutdown() {
	if lw.stop == nil {
		return
	}
	lw.stop()
	<-lw.done
	lw.stopSink()
	<-lw.sinkDone
	lw.stop = nil
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRestartOwesTheCooldown: an origin answers the first request with 429
// and Retry-After: 3; the worker learns the cooldown and publishes it; it is
// stopped and a fresh worker, its pacer restored from MIRROR_EVENTS, starts
// within the window with a new job for the origin at once. The origin gets
// no request before the deadline, then the probe and the rest.
func TestRestartOwesTheCooldown(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	o := newOrigin(t)
	o.throttle = func(n int, h http.Header) int {
		if n == 1 {
			h.Set("Retry-After", "3")
			return http.StatusTooManyRequests
		}
		return 0
	}
	const pause = 3 * time.Second
	root := t.TempDir()

	first := startLiveWorker(t, js, root, false)
	publishJobs(t, js, jobs.Job{URL: o.srv.URL + "/a.bin"})
	eventually(t, 10*time.Second, "the origin got no request", func() bool { n, _, _ := o.counts(); return n >= 1 })
	throttledAt := o.requestTimes()[0]

	// The worker published the cooldown it learned.
	var fact pacer.Event
	eventually(t, 10*time.Second, "no cooldown fact on MIRROR_EVENTS", func() bool {
		m, err := js.Stream(ctx, jobs.EventsStream)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := m.GetLastMsgForSubject(ctx, jobs.EventSubject(o.auth.Key()))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return json.Unmarshal(raw.Data, &fact) == nil && fact.Type == pacer.EventCooldown
	})
	if fact.Authority != o.auth.String() || fact.Until.Before(throttledAt.Add(pause)) {
		t.Fatalf("cooldown fact %+v; want %s until at least %s", fact, o.auth, throttledAt.Add(pause))
	}
	first.shutdown()

	// The restart, well within the cooldown, with a job the new worker can
	// take at once.
	if since := time.Since(throttledAt); since > pause/2 {
		t.Fatalf("the restart came %s after the 429; too late to test anything", since)
	}
	publishJobs(t, js, jobs.Job{URL: o.srv.URL + "/b.bin"})
	startLiveWorker(t, js, root, true)

	stored := func(name string) bool {
		_, err := os.Stat(filepath.Join(root, o.auth.Host+"_"+o.auth.Port, name))
		return err == nil
	}
	eventually(t, 30*time.Second, "both jobs stored", func() bool { return stored("a.bin") && stored("b.bin") })

	times := o.requestTimes()
	if len(times) < 3 {
		t.Fatalf("the origin got %d requests, want the 429, the probe and the other job", len(times))
	}
	// The deadline is measured as the origin measures a wait: on the
	// monotonic clock, from the 429's arrival. The pacer waits on the wall
	// clock, until the fact's Until. The two agree while the wall clock
	// does not move against the monotonic one; a failure gives both, so
	// that it tells a request the pacer let out before its own deadline
	// (a bug in the code) from a wall clock that gained on the monotonic
	// one during the wait (ADR 0004, "Which clock a cooldown runs on").
	deadline := throttledAt.Add(pause)
	for i, at := range times[1:] {
		if at.Before(deadline) {
			gained := wallSince(throttledAt, at) - at.Sub(throttledAt)
			t.Errorf("request %d came %s before the cooldown deadline (monotonic clock); on the wall clock, its arrival minus the fact's until is %s, and the wall clock gained %s on the monotonic one since the 429 (give or take a stamp's thread preempted between its two clock reads)",
				i+2, deadline.Sub(at), wallSince(fact.Until, at), gained)
		}
	}
}

// wallSince is b - a on the wall clock alone, whatever monotonic readings
// a and b carry.
func wallSince(a, b time.Time) time.Duration {
	return time.Duration(b.UnixNano() - a.UnixNano())
}
