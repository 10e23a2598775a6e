package policy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/policy"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func put(t *testing.T, kv jetstream.KeyValue, auth string, v policy.Value) {
	t.Helper()
	key, err := policy.Key(auth)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(testContext(t), key, data); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds, moving the fake clock a little on
// each poll (Run's re-watch backoff waits on it), for up to 30 s of real
// time.
func eventually(t *testing.T, clk *clock.Fake, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		if clk != nil {
			clk.Advance(50 * time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestWatcherLoadsFollowsEndsAndRewatches is the watcher's life on a real
// embedded JetStream: values written before Open are in force when Open
// returns; a change is applied as it arrives; an override ends at its
// until on the pod's own clock (no TTL); a value that does not parse is
// ignored and the key keeps what it had; a lost watch is started again
// and a key deleted meanwhile is gone.
func TestWatcherLoadsFollowsEndsAndRewatches(t *testing.T) {
	js, _ := brokertest.JetStream(t, brokertest.Start(t, broker.EmbeddedOptions{}))
	ctx := testContext(t)
	kv, err := policy.EnsureBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	put(t, kv, policy.DefaultKey, policy.Value{Floor: dur(2 * time.Second), Reason: "before start"})

	clk := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	base := &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}
	pc := pacer.New(&pacer.Options{Policy: base})
	reg := prometheus.NewRegistry()
	w, err := policy.Open(ctx, js, policy.Options{Base: base, Apply: pc.SetPolicy, Clock: clk, Registerer: reg,
		Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	if got := pc.Policy().Default; got.Floor != 2*time.Second || got.Source != policy.SourceDefault {
		t.Fatalf("default after Open = %+v, want the bucket's 2s", got)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()

	const a = "files.example.org:443"
	put(t, kv, a, policy.Value{Floor: dur(300 * time.Millisecond), MaxInFlight: num(5), Until: clk.Now().Add(time.Minute)})
	eventually(t, nil, "the authority's key applied", func() bool { return pc.Policy().Limits(a).Floor == 300*time.Millisecond })
	if got := pc.Policy().Limits(a); got.MaxInFlight != 5 || got.Source != policy.SourceKV {
		t.Fatalf("%s = %+v, want cap 5 from kv", a, got)
	}

	// A value written past the command, malformed: ignored, the key keeps
	// its value.
	key, _ := policy.Key(a)
	if _, err := kv.Put(ctx, key, []byte(`{"floor":"fast"}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, nil, "the malformed value counted", func() bool { return counter(t, reg, "mirrorworker_policy_invalid_total") == 1 })
	if got := pc.Policy().Limits(a).Floor; got != 300*time.Millisecond {
		t.Fatalf("floor after a malformed value = %s, want 300ms kept", got)
	}

	// The until passes on the pod's clock: the default key applies again.
	clk.Advance(59 * time.Second)
	if got := pc.Policy().Limits(a).Floor; got != 300*time.Millisecond {
		t.Fatalf("floor 1 s before the until = %s, want 300ms", got)
	}
	clk.Advance(time.Second)
	eventually(t, nil, "the override ended at its until", func() bool { return pc.Policy().Limits(a).Source == policy.SourceDefault })
	if got := pc.Policy().Limits(a).Floor; got != 2*time.Second {
		t.Fatalf("floor after the until = %s, want the default key's 2s", got)
	}

	// The watch is lost; meanwhile the default key is deleted. The
	// re-watch loads the bucket whole: the static default is back.
	w.DropWatch()
	if err := kv.Delete(ctx, policy.DefaultKey); err != nil {
		t.Fatal(err)
	}
	eventually(t, clk, "the re-watch saw the deleted default", func() bool { return pc.Policy().Default.Source == policy.SourceStatic })
	if got := pc.Policy().Default.Floor; got != time.Second {
		t.Fatalf("default after the delete = %s, want the static 1s", got)
	}
	if n := counter(t, reg, "mirrorworker_policy_watch_restarts_total"); n < 1 {
		t.Fatalf("watch restarts = %v, want at least 1", n)
	}
	// And the new watch follows changes.
	put(t, kv, policy.DefaultKey, policy.Value{MaxInFlight: num(7)})
	eventually(t, nil, "a change after the re-watch", func() bool { return pc.Policy().Default.MaxInFlight == 7 })

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v after its context ended, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
}

// lockedBuffer is a log sink safe for the watcher's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAChangeBeforeTheWatchIsSaid: a value changed after Open loaded the
// bucket and before Run's watch started arrives among the watch's initial
// values; it is applied and logged "policy changed" with its revision,
// as a change that arrives alone is, so that an operator (and a test
// waiting for every pod to apply a change) sees every pod take it.
func TestAChangeBeforeTheWatchIsSaid(t *testing.T) {
	js, _ := brokertest.JetStream(t, brokertest.Start(t, broker.EmbeddedOptions{}))
	ctx := testContext(t)
	kv, err := policy.EnsureBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	const a = "files.example.org:443"
	put(t, kv, a, policy.Value{Floor: dur(time.Second), Reason: "first"})
	base := &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}
	pc := pacer.New(&pacer.Options{Policy: base})
	var logs lockedBuffer
	w, err := policy.Open(ctx, js, policy.Options{Base: base, Apply: pc.SetPolicy, Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	put(t, kv, a, policy.Value{Floor: dur(400 * time.Millisecond), Reason: "while no watch ran"})
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go w.Run(rctx)
	eventually(t, nil, "the change applied", func() bool { return pc.Policy().Limits(a).Floor == 400*time.Millisecond })
	eventually(t, nil, "the change logged", func() bool {
		return strings.Contains(logs.String(), `"authority":"`+a+`","revision":2,"floor":"400ms","reason":"while no watch ran","message":"policy changed"`)
	})
}
