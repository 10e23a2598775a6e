package replay_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/replay"
	"github.com/mirrorworker/mirrorworker/worker"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// The concrete packages satisfy the worker's interfaces, as cmd wires them.
var (
	_ worker.Fetcher = (*fetch.Client)(nil)
	_ worker.Target  = (*mirror.FileTarget)(nil)
	_ worker.Pacer   = (*pacer.Pacer)(nil)
)

// testPolicy spaces nothing (floor 0) so that a thousand jobs take a
// moment; every other rule of the pacer applies.
func testPolicy() *pacer.Policy {
	return &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 4}}
}

// replayInto replays into the mirror at root as `mirrorworker replay` wires
// it: a worker with its own pacer restored from MIRROR_EVENTS, publishing
// its own facts, metrics on a private registry.
func replayInto(t *testing.T, js jetstream.JetStream, root string, start replay.Start, f replay.Filter) (replay.Result, replay.Summary) {
	t.Helper()
	ctx := brokertest.Context(t)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	reg := prometheus.NewRegistry()
	metrics, err := worker.NewMetrics(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	sink := facts.NewSink(js, log, metrics)
	var tally replay.Tally
	pc := pacer.New(&pacer.Options{Policy: testPolicy(), OnEvent: sink.Handle})
	if _, err := facts.Restore(ctx, js, pc, facts.RestoreOptions{Logger: log}); err != nil {
		t.Fatal(err)
	}
	target, err := mirror.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	fc := fetch.New(&fetch.Options{AllowPrivate: true})
	defer fc.CloseIdleConnections()
	sctx, stopSink := context.WithCancel(context.Background())
	var sinkDone sync.WaitGroup
	sinkDone.Add(1)
	go func() { defer sinkDone.Done(); _ = sink.Run(sctx) }()
	defer func() { stopSink(); sinkDone.Wait() }()

	subjects, err := f.Subjects()
	if err != nil {
		t.Fatal(err)
	}
	res, err := replay.Run(ctx, js, func(ctx context.Context, c jetstream.Consumer) error {
		w, err := worker.New(worker.Deps{JS: js, Consumer: c, Fetcher: fc, Target: target, Pacer: pc}, &worker.Options{
			Concurrency: 16, Metrics: metrics, Logger: log, WorkerID: "replay-test", OnOutcome: tally.Add,
		})
		if err != nil {
			return err
		}
		return w.Run(ctx)
	}, &replay.Options{Start: start, Subjects: subjects, Logger: log})
	if err != nil {
		t.Fatalf("replay.Run: %v", err)
	}
	sum := tally.Summary()
	// The hook sees exactly what mirrorworker_jobs_total counts.
	if got := jobsTotal(t, reg); got != sum {
		t.Errorf("OnOutcome tally %+v, jobs_total %+v", sum, got)
	}
	return res, sum
}

// jobsTotal reads mirrorworker_jobs_total from g, by outcome.
func jobsTotal(t *testing.T, g prometheus.Gatherer) replay.Summary {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var s replay.Summary
	for _, mf := range mfs {
		if mf.GetName() != "mirrorworker_jobs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n := int64(m.GetCounter().GetValue())
			for _, l := range m.GetLabel() {
				if l.GetName() != "outcome" {
					continue
				}
				switch l.GetValue() {
				case worker.OutcomeStored:
					s.Stored += n
				case worker.OutcomeUnchanged:
					s.Unchanged += n
				case worker.OutcomeDeferred:
					s.Deferred += n
				case worker.OutcomeRetried:
					s.Retried += n
				case worker.OutcomeDeadLettered:
					s.DeadLettered += n
				}
			}
		}
	}
	return s
}

// mtimes maps every file under root (objects and metadata) to its
// modification time.
func mtimes(t *testing.T, root string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fi.ModTime()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// objectFiles lists the stored objects under root (not mirrorworker's own
// directory), relative and slash-separated.
func objectFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for p := range mtimes(t, root) {
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if !strings.HasPrefix(rel, ".mirrorworker/") {
			out = append(out, rel)
		}
	}
	return out
}

func TestReplayRebuildsAndRemirrorsCheaply(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	origins := []*origin{newOrigin(t), newOrigin(t), newOrigin(t), newOrigin(t)}
	const perOrigin = 250
	var all []jobs.Job
	want := map[string][]byte{} // target → bytes
	wantCount := map[string]int{}
	for i := range perOrigin * len(origins) {
		o := origins[i%len(origins)]
		path := fmt.Sprintf("/pkg/%d/file-%d.bin", i%7, i)
		j := jobs.Job{URL: o.srv.URL + path, Tenant: []string{"acme", "zeta"}[i%2]}
		all = append(all, j)
		want[o.auth.Host+"_"+o.auth.Port+path] = objectBody(path)
		wantCount[o.auth.String()]++
	}
	publishJobs(t, js, all...)
	if len(want) != 1000 {
		t.Fatalf("%d distinct targets, want 1000", len(want))
	}

	// A dry run counts without fetching.
	counts, err := replay.Count(ctx, js, replay.Start{}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if counts.Total != 1000 || !maps.Equal(jobsByAuthority(counts), wantCount) {
		t.Fatalf("dry run = %d %v, want 1000 %v", counts.Total, counts.ByAuthority, wantCount)
	}
	for _, o := range origins {
		if n, _, _ := o.counts(); n != 0 {
			t.Fatalf("the dry run sent %d requests", n)
		}
	}

	rootA := t.TempDir()
	t.Run("into an empty root every job is stored byte-exact", func(t *testing.T) {
		res, sum := replayInto(t, js, rootA, replay.Start{}, replay.Filter{})
		if res.Jobs != 1000 || sum.Stored != 1000 || sum.Unchanged != 0 || sum.DeadLettered != 0 {
			t.Fatalf("replay = %+v, %v; want 1000 jobs stored", res, sum)
		}
		for target, body := range want {
			got, err := os.ReadFile(filepath.Join(rootA, filepath.FromSlash(target)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, body) {
				t.Fatalf("%s: %d bytes differ from the origin's %d", target, len(got), len(body))
			}
		}
		if n := len(objectFiles(t, rootA)); n != 1000 {
			t.Errorf("%d objects under the root, want 1000", n)
		}
		for _, o := range origins {
			if n, c, _ := o.counts(); n != perOrigin || c != 0 {
				t.Errorf("origin %s: %d requests (%d conditional), want %d unconditional", o.auth, n, c, perOrigin)
			}
		}
	})

	t.Run("over the same root only conditional requests, no file rewritten", func(t *testing.T) {
		before := mtimes(t, rootA)
		var reqs, conds, nms [4]int
		for i, o := range origins {
			reqs[i], conds[i], nms[i] = o.counts()
		}
		_, sum := replayInto(t, js, rootA, replay.Start{}, replay.Filter{})
		if sum.Unchanged != 1000 || sum.Stored != 0 || sum.DeadLettered != 0 {
			t.Fatalf("replay = %v; want 1000 unchanged", sum)
		}
		for i, o := range origins {
			n, c, nm := o.counts()
			if n-reqs[i] != perOrigin || c-conds[i] != perOrigin || nm-nms[i] != perOrigin {
				t.Errorf("origin %s: %d requests, %d conditional, %d answered 304; want %d of each",
					o.auth, n-reqs[i], c-conds[i], nm-nms[i], perOrigin)
			}
		}
		after := mtimes(t, rootA)
		if !maps.EqualFunc(before, after, time.Time.Equal) {
			for p, m := range after {
				if b, ok := before[p]; !ok || !b.Equal(m) {
					t.Errorf("%s was written (mtime %v, before %v)", p, m, b)
				}
			}
			for p := range before {
				if _, ok := after[p]; !ok {
					t.Errorf("%s was removed", p)
				}
			}
		}
	})

	t.Run("a filtered replay touches only the chosen authority", func(t *testing.T) {
		chosen := origins[2]
		f := replay.Filter{Authorities: auths(t, chosen.auth.String())}
		subjects, err := f.Subjects()
		if err != nil {
			t.Fatal(err)
		}
		dry, err := replay.Count(ctx, js, replay.Start{}, subjects, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if dry.Total != perOrigin || !maps.Equal(jobsByAuthority(dry), map[string]int{chosen.auth.String(): perOrigin}) {
			t.Fatalf("filtered dry run = %d %v", dry.Total, dry.ByAuthority)
		}
		var reqs [4]int
		for i, o := range origins {
			reqs[i], _, _ = o.counts()
		}
		rootB := t.TempDir()
		_, sum := replayInto(t, js, rootB, replay.Start{}, f)
		if sum.Stored != perOrigin || sum.DeadLettered != 0 {
			t.Fatalf("replay = %v; want %d stored", sum, perOrigin)
		}
		for i, o := range origins {
			n, _, _ := o.counts()
			wantN := 0
			if o == chosen {
				wantN = perOrigin
			}
			if n-reqs[i] != wantN {
				t.Errorf("origin %s got %d requests, want %d", o.auth, n-reqs[i], wantN)
			}
		}
		prefix := chosen.auth.Host + "_" + chosen.auth.Port + "/"
		files := objectFiles(t, rootB)
		if len(files) != perOrigin {
			t.Errorf("%d objects in the new root, want %d", len(files), perOrigin)
		}
		for _, f := range files {
			if !strings.HasPrefix(f, prefix) {
				t.Errorf("%s stored by a replay filtered to %s", f, chosen.auth)
			}
		}
	})

	t.Run("from a sequence, filtered by tenant", func(t *testing.T) {
		// Sequences 901..1000, tenant zeta (odd i, even sequence): 50 jobs.
		start := replay.Start{Seq: 901}
		f := replay.Filter{Tenants: []string{"zeta"}}
		subjects, _ := f.Subjects()
		dry, err := replay.Count(ctx, js, start, subjects, time.Now())
		if err != nil || dry.Total != 50 {
			t.Fatalf("dry run = %+v, %v; want 50", dry, err)
		}
		res, sum := replayInto(t, js, t.TempDir(), start, f)
		if res.Jobs != 50 || sum.Stored != 50 {
			t.Fatalf("replay = %+v, %v; want 50 stored", res, sum)
		}
	})
}

// jobsByAuthority is a dry run's job count per authority.
func jobsByAuthority(c replay.Counts) map[string]int {
	out := map[string]int{}
	for a, n := range c.ByAuthority {
		out[a] = n.Jobs
	}
	return out
}
