package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// BenchmarkBacklogMemory measures the memory of `mirrorworker run`
// (in-process, embedded JetStream included, defaults but --floor 0) while it
// works through a backlog spread over 100,000 authorities, for several
// backlog sizes: the worker must hold a bounded part of a backlog in memory,
// whatever its size. Each size stores the backlog (job i goes to authority
// i mod 100,000), returns the publisher's memory to the OS, starts the
// worker and samples the process every 250 ms until it has acked 10,000
// jobs; the origins serve all 100,000 authorities from child processes
// (benchorigin_test.go), outside the measured process. The same work at
// every size, so what grows with the backlog shows.
//
// Metrics: rss_peak_MiB and rss_idle_MiB (before the worker starts),
// heap_peak_MiB (Go heap in use, the embedded server's included), fds_peak
// (open descriptors: most are idle connections, one per authority used,
// up to --max-idle-conns) and jobs/s over the second half of the 10,000.
//
//	MW_BENCH_BACKLOG=10000,100000,1000000 go test -run '^$' -bench BacklogMemory -benchtime 1x -timeout 60m ./cmd/mirrorworker/
//
// The worker starts once the stream's duplicate window (2 min) has passed
// since the backlog was stored: until then JetStream holds every job id
// published within it in memory (about 200 bytes each: 1,000,000 jobs
// enqueued in a burst cost ~200 MiB for 2 minutes, whatever the backlog).
// MW_BENCH_BURST=1 starts the worker at once instead, to measure that.
//
// MW_BENCH_BACKLOG lists the backlog sizes; without it the benchmark does
// not run (make bench runs every package's benchmarks);
// MW_BENCH_HEAPPROFILE=file writes a heap profile once the 10,000 are acked.
func BenchmarkBacklogMemory(b *testing.B) {
	const authorities = 100000
	const processed = 10000
	v := os.Getenv("MW_BENCH_BACKLOG")
	if v == "" {
		// Minutes of work and 100,000 listeners: only when asked for.
		b.Skip("set MW_BENCH_BACKLOG=10000,100000,1000000 (backlog sizes) to run it, or use make bench-memory")
	}
	var sizes []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < processed {
			b.Fatalf("MW_BENCH_BACKLOG=%q: want sizes of at least %d, comma-separated", v, processed)
		}
		sizes = append(sizes, n)
	}
	o := startBenchOrigin(b, authorities, 4<<10)
	for _, size := range sizes {
		b.Run("backlog="+strconv.Itoa(size), func(b *testing.B) {
			bl := benchBacklog{origin: o, authorities: authorities, warm: processed / 2, measured: processed / 2}
			dataDir := b.TempDir()
			publishBacklog(b, dataDir, size, bl.job)
			if os.Getenv("MW_BENCH_BURST") == "" {
				// JetStream keeps every job id of the duplicate window in
				// memory (and rebuilds them at start-up): memory of the
				// burst that enqueued the backlog, not of the backlog.
				time.Sleep(jobs.DefaultJobsDuplicates + 5*time.Second)
			}
			runtime.GC()
			debug.FreeOSMemory()
			idle := procStatus("VmRSS")

			var mu sync.Mutex
			var rssPeak, heapPeak uint64
			var fdsPeak int
			sample := func() {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				rss := procStatus("VmRSS")
				fds := openFiles()
				mu.Lock()
				rssPeak, heapPeak, fdsPeak = max(rssPeak, rss), max(heapPeak, ms.HeapInuse), max(fdsPeak, fds)
				mu.Unlock()
			}
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				t := time.NewTicker(250 * time.Millisecond)
				defer t.Stop()
				for {
					sample()
					select {
					case <-stop:
						return
					case <-t.C:
					}
				}
			}()
			res := runWorkerOn(b, dataDir, bl, nil, true)
			close(stop)
			<-sampled
			b.ReportMetric(float64(idle)/(1<<20), "rss_idle_MiB")
			b.ReportMetric(float64(rssPeak)/(1<<20), "rss_peak_MiB")
			b.ReportMetric(float64(heapPeak)/(1<<20), "heap_peak_MiB")
			b.ReportMetric(float64(fdsPeak), "fds_peak")
			b.ReportMetric(res.rate(), "jobs/s")
		})
	}
}

// publishBacklog stores n jobs (job(i) gives each one's URL and target) on
// MIRROR_JOBS under dataDir, with the streams as run makes them, through
// an embedded server that is shut down before it returns.
func publishBacklog(b testing.TB, dataDir string, n int, job func(i int) (url, target string)) {
	b.Helper()
	ctx := context.Background()
	emb, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: filepath.Join(dataDir, "nats")})
	if err != nil {
		b.Fatal(err)
	}
	defer emb.Shutdown()
	nc, err := emb.Connect("bench-publish")
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		b.Fatal(err)
	}
	publishJobs(b, js, n, job)
}

// publishJobs publishes n jobs (job(i) gives each one's URL and target) to
// MIRROR_JOBS through js and waits for their acks.
func publishJobs(b testing.TB, js jetstream.JetStream, n int, job func(i int) (url, target string)) {
	b.Helper()
	for i := range n {
		u, t := job(i)
		m, _, err := jobs.NewMsg(jobs.Job{ID: "j" + strconv.Itoa(i), URL: u, Target: t})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(10 * time.Minute):
		b.Fatal("publish acks did not arrive")
	}
}

// runWorkerOn runs `mirrorworker run` in-process on dataDir, whose backlog
// is already stored, until the jobs of bl are acked: those numbered below
// bl.total(), or with anyJob that many jobs, whichever they are.
func runWorkerOn(b testing.TB, dataDir string, bl benchBacklog, args []string, anyJob bool) pipelineResult {
	b.Helper()
	ctx := context.Background()
	bl.origin.reset(b, bl.warm)
	full := append([]string{"run", "--data-dir", dataDir, "--embedded-listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--floor", "0", "--allow-private-networks"}, args...)
	lw := newLogWatch()
	rctx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	var runErr error
	go func() {
		defer close(exited)
		runErr = run(rctx, full, noEnv, strings.NewReader(""), io.Discard, lw)
	}()
	defer func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(time.Minute):
			b.Errorf("worker did not stop; log:\n%s", lw)
		}
		if runErr != nil {
			b.Errorf("run: %v; log:\n%s", runErr, lw)
		}
	}()
	var si startInfo
	select {
	case si = <-lw.started:
	case <-exited:
		b.Fatalf("worker exited before its start line; log:\n%s", lw)
	case <-time.After(time.Minute):
		b.Fatalf("no start line; log:\n%s", lw)
	}
	wnc, err := nats.Connect(si.NATSURL)
	if err != nil {
		b.Fatal(err)
	}
	defer wnc.Close()
	watch := newAckWatch(bl.warm, bl.measured, nil)
	watch.anyJob = anyJob
	watch.subscribe(b, wnc, jobs.JobsStream)
	elapsed, deliveries, naks := watch.wait(b, 20*time.Minute)
	if path := os.Getenv("MW_BENCH_LOG"); path != "" {
		// The worker's log, for a look at why jobs were deferred
		// (MW_BENCH_WORKER_ARGS="--log-level debug").
		os.WriteFile(path, []byte(lw.String()), 0o644)
	}
	if path := os.Getenv("MW_BENCH_HEAPPROFILE"); path != "" {
		// The heap while the worker runs (go test -memprofile writes it
		// only after the worker has stopped).
		if f, err := os.Create(path); err == nil {
			pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}
	res := pipelineResult{measured: bl.measured, elapsed: elapsed, origin: bl.origin.stats(b), deliveries: deliveries, naks: naks, cpu: watch.cpu(),
		whole: watch.whole(), early: watch.earlyAcks(), curve: watch.curve()}
	wjs, err := jetstream.New(wnc)
	if err != nil {
		b.Fatal(err)
	}
	if s, err := wjs.Stream(ctx, jobs.ParkStream); err == nil {
		if info, err := s.Info(ctx); err == nil {
			res.parked = info.State.LastSeq // every job ever parked, unparked or not
		}
	}
	return res
}

// procStatus returns a field of /proc/self/status in bytes (0 if absent).
func procStatus(field string) uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			var kb uint64
			fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}

// openFiles returns how many descriptors the process has open.
func openFiles() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}
