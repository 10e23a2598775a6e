package pipeline_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/lifecycle"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/pipeline"
)

// startJetStream runs an embedded JetStream server with the project's
// streams for one test.
func startJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, _ := brokertest.JetStream(t, brokertest.Start(t, broker.EmbeddedOptions{}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	return js
}

func newParts(t *testing.T, js jetstream.JetStream) *pipeline.Parts {
	t.Helper()
	p, err := pipeline.New(js, pipeline.Config{
		Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}},
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestRunStopsTheSinkAfterTheWork: a pacer fact learned while the work is
// stopping (a worker's grace period) is still published, because the sink
// stops only once the work has returned; and a stop asked for by ctx is no
// error.
func TestRunStopsTheSinkAfterTheWork(t *testing.T) {
	js := startJetStream(t)
	p := newParts(t, js)
	ctx, cancel := context.WithCancel(context.Background())
	stoppingSeen := make(chan bool, 1)
	var trailingEndedEarly bool
	workStarted := make(chan struct{})
	workReturned := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- p.Run(ctx, func(wctx context.Context) error {
			defer close(workReturned)
			close(workStarted)
			<-wctx.Done()
			// Learned during the grace period: a 429 opens a cooldown,
			// whose facts the sink must still publish.
			now := time.Now()
			pm, err := p.Pacer.Acquire(now, "files.example.org:443", 0)
			if err != nil {
				return err
			}
			p.Pacer.Done(now, pm, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"30"}}})
			return nil
		}, &pipeline.RunOptions{
			Stopping: func() {
				select {
				case <-workReturned:
					stoppingSeen <- false
				default:
					stoppingSeen <- true
				}
			},
			Trailing: []func(context.Context) error{func(tctx context.Context) error {
				<-tctx.Done()
				select {
				case <-workReturned:
				default:
					trailingEndedEarly = true
				}
				return nil
			}},
		})
	}()
	<-workStarted
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Run after a stop asked for by ctx = %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
	if !<-stoppingSeen {
		t.Error("Stopping was called after the work returned, want before")
	}
	if trailingEndedEarly {
		t.Error("a trailing part's context ended before the work returned")
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	s, err := js.Stream(sctx, jobs.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		t.Error("no pacer fact published: the sink stopped before the work")
	}
}

func TestRunReturnsTheWorksError(t *testing.T) {
	p := newParts(t, startJetStream(t))
	boom := errors.New("boom")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Run(ctx, func(context.Context) error { return boom }, nil); !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want the work's error", err)
	}
	// Work that finishes (a replay) ends the run without error.
	if err := p.Run(ctx, func(context.Context) error { return nil }, nil); err != nil {
		t.Fatalf("Run of finished work = %v, want nil", err)
	}
	// A failing service stops the work, and its error is the run's.
	err := p.Run(ctx, func(wctx context.Context) error { <-wctx.Done(); return nil }, &pipeline.RunOptions{
		Services: []func(context.Context) error{func(context.Context) error { return boom }},
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Run with a failing service = %v, want its error", err)
	}
}

func TestDefaultTargetAndOpenTarget(t *testing.T) {
	dir := t.TempDir()
	spec, err := pipeline.DefaultTarget(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := "file://" + filepath.Join(dir, "mirror"); spec != want {
		t.Fatalf("DefaultTarget = %q, want %q", spec, want)
	}
	target, err := pipeline.OpenTarget(spec)
	if err != nil {
		t.Fatal(err)
	}
	if target.Root() != filepath.Join(dir, "mirror") {
		t.Fatalf("root %q", target.Root())
	}
	// A target whose reserved directory cannot be made (a file stands
	// there) fails before anything starts.
	blocked := filepath.Join(dir, "blocked")
	if err := os.MkdirAll(blocked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blocked, mirror.ReservedDir), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.OpenTarget(blocked); err == nil || !strings.Contains(err.Error(), blocked) {
		t.Fatalf("OpenTarget(blocked) = %v, want an error naming the target", err)
	}
}

// TestStagesStopInTheDocumentedOrder: the process's parts stop in the
// order of the table beside pipeline.StageAdmission, each stage only once
// the one above it has returned: the worker has handed its jobs back before
// the NATS connection closes, and the admin endpoint stops last.
func TestStagesStopInTheDocumentedOrder(t *testing.T) {
	stages := []struct {
		stage lifecycle.Stage
		part  string
	}{
		{pipeline.StageAdmin, "admin endpoint"}, // added first: the order is the stages'
		{pipeline.StageServer, "embedded server"},
		{pipeline.StageConn, "NATS connection"},
		{pipeline.StageServices, "follower"},
		{pipeline.StageTrailing, "lease manager"},
		{pipeline.StageWork, "worker"},
		{pipeline.StageAdmission, "stop taking"},
	}
	g := pipeline.NewGroup(zerolog.Nop())
	var (
		mu  sync.Mutex
		got []string
	)
	note := func(s string) { mu.Lock(); got = append(got, s); mu.Unlock() }
	for _, s := range stages {
		g.Add(s.stage, s.part, func(ctx context.Context) error {
			<-ctx.Done()
			note(s.part + " told")
			note(s.part + " returned")
			return nil
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Run(ctx); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := len(stages) - 1; i >= 0; i-- {
		want = append(want, stages[i].part+" told", stages[i].part+" returned")
	}
	if !slices.Equal(got, want) {
		t.Errorf("stop order\n got %v\nwant %v", got, want)
	}
}
