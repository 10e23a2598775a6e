package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkThroughput measures, side by side in one run, the worker end to
// end (`mirrorworker run` in-process, as a user starts it: embedded
// JetStream, the file mirror with fsync, default flags but --floor 0) and a
// raw pipeline written with no project code: G goroutines that pull from a
// JetStream pull consumer on an embedded nats-server, GET with net/http
// keep-alive, write a temp file, fsync it, rename it into place, fsync the
// directory and ack. Both drain the same backlog shape: one warm-up job per
// authority, then the measured jobs, round robin over the authorities, 4 KiB
// bodies from loopback origins (child processes, benchorigin_test.go). The
// clock runs from the moment the warm-up jobs are acked to the last
// measured ack, both seen on the acks' subjects; connections are those the
// origin accepted whose first request was a measured job.
//
// Metrics: raw_jobs/s, worker_jobs/s, ratio (worker/raw), connects/job and
// deliveries/job (NumDelivered of each acked delivery) and CPU µs/job
// (this process's user and system time over the measured window: the
// pipeline and its embedded nats-server, not the origins) for both, and
// the worker's naks/job and parked/job (0 when nothing throttles). Each
// configuration runs MW_BENCH_ROUNDS (default 3) rounds, alternating which
// pipeline goes first; ratio is the median of the rounds' ratios, with
// ratio_min and ratio_max, and the other metrics are those of each
// pipeline's median run. The log (-v) has every round.
//
//	go test -run '^$' -bench Throughput -benchtime 1x -timeout 60m -v ./cmd/mirrorworker/
//
// MW_BENCH_JOBS sets the measured jobs per configuration (default: 10,000,
// and 20,000 at 10,000 authorities); MW_BENCH_WORKER_ARGS adds flags to
// the worker (e.g. "--concurrency 64"); MW_BENCH_ONLY=worker (or raw) runs
// one pipeline alone, for -cpuprofile or strace; MW_BENCH_DISTINCT=1 makes
// every object's bytes differ (the default serves one body to every job,
// which each Put finds in the sha256 index under another key; see
// benchDistinctEnv). MW_BENCH_PROCS=1 runs
// each side of each round as a process of its own on a nats-server process
// of its own, with a store and mirror deleted after the round (CPU is then
// the pipeline's and its nats-server's), as issue 40 measured it; there
// each side also logs its nats-server's /varz message counts and its CPU
// before the first ack and per job after it, MW_BENCH_NATS_SUBJECTS=1
// adds a count by subject class (bench_natscount_test.go; it loads the
// server, so time nothing with it), MW_BENCH_NATS_PROFILE=dir saves a CPU
// profile of each nats-server, and MW_BENCH_PARTITIONS=n makes the jobs
// stream with n partitions. Both sides' stores and mirrors are made under
// $TMPDIR (b.TempDir, in both modes), so TMPDIR=/mnt/x runs them on the
// file system mounted there (ADR 0036's eighth pass: a journalled ext4);
// nothing else of a round writes there but the test binary's own build
// when `go test` makes it (build it first with go test -c to keep that
// out). ns/op is meaningless here: each configuration runs once per
// -count, whatever b.N.
func BenchmarkThroughput(b *testing.B) {
	for _, c := range []struct {
		name        string
		authorities int
		raw         int      // goroutines of the raw pipeline
		args        []string // worker flags beyond the defaults
		jobs        int
	}{
		{name: "authorities=10", authorities: 10, raw: 32, jobs: 10000},
		{name: "authorities=1000", authorities: 1000, raw: 32, jobs: 10000},
		{name: "authorities=10000", authorities: 10000, raw: 32, jobs: 20000},
		{name: "authorities=1/max-in-flight=2", authorities: 1, raw: 2, args: []string{"--max-in-flight", "2"}, jobs: 3000},
	} {
		b.Run(c.name, func(b *testing.B) {
			n := c.jobs
			if v, err := strconv.Atoi(os.Getenv("MW_BENCH_JOBS")); err == nil && v > 0 {
				n = v
			}
			args := append(c.args, strings.Fields(os.Getenv("MW_BENCH_WORKER_ARGS"))...)
			o := startBenchOrigin(b, c.authorities, 4<<10)
			bl := benchBacklog{origin: o, authorities: c.authorities, warm: c.authorities, measured: n}

			switch os.Getenv("MW_BENCH_ONLY") {
			case "worker": // for profiles and syscall counts of one pipeline: no ratio
				wk := runWorkerPipeline(b, bl, args)
				b.ReportMetric(wk.rate(), "worker_jobs/s")
				b.ReportMetric(wk.wholeRate(bl.total()), "worker_whole_jobs/s")
				b.ReportMetric(wk.cpuPerJob(), "worker_cpu_µs/job")
				b.ReportMetric(wk.connectsPerJob(), "worker_connects/job")
				b.ReportMetric(wk.deliveriesPerJob(), "worker_deliveries/job")
				return
			case "raw":
				raw := runRawPipeline(b, bl, c.raw)
				b.ReportMetric(raw.rate(), "raw_jobs/s")
				b.ReportMetric(raw.wholeRate(bl.total()), "raw_whole_jobs/s")
				b.ReportMetric(raw.cpuPerJob(), "raw_cpu_µs/job")
				b.ReportMetric(raw.connectsPerJob(), "raw_connects/job")
				return
			}
			runRawSide, runWorkerSide := runRawPipeline, runWorkerPipeline
			if os.Getenv(benchProcsEnv) != "" {
				// Each side of each round a process of its own, on a
				// nats-server process of its own (throughput_procs_bench_test.go).
				runRawSide = func(b *testing.B, bl benchBacklog, g int) pipelineResult { return runProcRound(b, bl, true, g, nil) }
				runWorkerSide = func(b *testing.B, bl benchBacklog, args []string) pipelineResult {
					return runProcRound(b, bl, false, 0, args)
				}
			}
			rounds := 3
			if v, err := strconv.Atoi(os.Getenv("MW_BENCH_ROUNDS")); err == nil && v > 0 {
				rounds = v
			}
			// Rounds alternate which pipeline goes first (raw-worker,
			// worker-raw, ...), so that neither always meets the disk
			// after the other; the ratio is the median of the rounds'.
			var raws, wks []pipelineResult
			var ratios []float64
			for r := range rounds {
				var raw, wk pipelineResult
				if r%2 == 0 {
					raw = runRawSide(b, bl, c.raw)
					wk = runWorkerSide(b, bl, args)
				} else {
					wk = runWorkerSide(b, bl, args)
					raw = runRawSide(b, bl, c.raw)
				}
				raws, wks = append(raws, raw), append(wks, wk)
				ratios = append(ratios, wk.rate()/raw.rate())
				b.Logf("round %d: raw %.0f jobs/s (%.0f µs CPU/job), worker %.0f jobs/s (%.0f µs CPU/job), ratio %.3f; first ack to last: raw %.0f, worker %.0f jobs/s, ratio %.3f; measured jobs acked before the warm-up's last: raw %d, worker %d",
					r+1, raw.rate(), raw.cpuPerJob(), wk.rate(), wk.cpuPerJob(), ratios[r],
					raw.wholeRate(bl.total()), wk.wholeRate(bl.total()), wk.wholeRate(bl.total())/raw.wholeRate(bl.total()), raw.early, wk.early)
				b.Logf("round %d: all jobs acked by (from the first ack): raw %s; worker %s", r+1, raw.curveString(), wk.curveString())
			}
			raw, wk := medianResult(raws), medianResult(wks)
			b.ReportMetric(raw.rate(), "raw_jobs/s")
			b.ReportMetric(wk.rate(), "worker_jobs/s")
			b.ReportMetric(median(ratios), "ratio")
			b.ReportMetric(slices.Min(ratios), "ratio_min")
			b.ReportMetric(slices.Max(ratios), "ratio_max")
			b.ReportMetric(raw.cpuPerJob(), "raw_cpu_µs/job")
			b.ReportMetric(wk.cpuPerJob(), "worker_cpu_µs/job")
			b.ReportMetric(raw.connectsPerJob(), "raw_connects/job")
			b.ReportMetric(wk.connectsPerJob(), "worker_connects/job")
			b.ReportMetric(raw.deliveriesPerJob(), "raw_deliveries/job")
			b.ReportMetric(wk.deliveriesPerJob(), "worker_deliveries/job")
			b.ReportMetric(float64(wk.naks)/float64(n), "worker_naks/job")
			b.ReportMetric(float64(wk.parked)/float64(n), "worker_parked/job")
		})
	}
}

// median is the median of xs (the mean of the middle two for an even
// count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianResult is the run of median rate among rs (the slower middle one
// for an even count).
func medianResult(rs []pipelineResult) pipelineResult {
	s := slices.SortedFunc(slices.Values(rs), func(a, b pipelineResult) int { return cmp.Compare(a.rate(), b.rate()) })
	return s[(len(s)-1)/2]
}

// benchBacklog is the backlog of one configuration: job i goes to
// authority i mod authorities; jobs 0..warm-1 are the warm-up.
type benchBacklog struct {
	origin      *benchOrigin
	authorities int
	warm        int
	measured    int
}

func (bl benchBacklog) total() int { return bl.warm + bl.measured }

func (bl benchBacklog) job(i int) (url, target string) {
	k := i % bl.authorities
	return bl.origin.url(k, i), fmt.Sprintf("a%d/%d", k, i)
}

// pipelineResult is what one pipeline did on the measured jobs.
type pipelineResult struct {
	measured   int
	elapsed    time.Duration
	origin     originStats
	deliveries uint64 // sum of NumDelivered over the measured acks
	naks       int
	parked     uint64
	cpu        time.Duration   // this process's CPU time over the measured window
	whole      time.Duration   // first ack to last, warm-up included
	early      uint64          // measured jobs acked before the last warm-up job
	curve      []time.Duration // when each tenth of all jobs was acked, from the first ack (ackWatch.curve)
}

// curveString is the ack curve as "10% 0.41s, 20% 0.83s, ...".
func (r pipelineResult) curveString() string {
	var parts []string
	for i, d := range r.curve {
		parts = append(parts, fmt.Sprintf("%d%% %.2fs", 10*(i+1), d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

func (r pipelineResult) rate() float64 { return float64(r.measured) / r.elapsed.Seconds() }

// wholeRate is the jobs per second from the first ack to the last.
func (r pipelineResult) wholeRate(total int) float64 { return float64(total) / r.whole.Seconds() }
func (r pipelineResult) cpuPerJob() float64 {
	return float64(r.cpu.Microseconds()) / float64(r.measured)
}
func (r pipelineResult) connectsPerJob() float64 {
	return float64(r.origin.measured) / float64(r.measured)
}
func (r pipelineResult) deliveriesPerJob() float64 {
	return float64(r.deliveries) / float64(r.measured)
}

// ackWatch follows the acknowledgements of one stream's consumers on their
// subjects ($JS.ACK.<stream>.>), where every pipeline's acks pass whatever
// its code, and times the measured jobs: stream sequences 1..warm are the
// warm-up, the next measured ones are timed. Safe for concurrent use.
type ackWatch struct {
	warm, measured uint64
	onWarm         func() // called once the warm-up jobs are acked
	onFirst        func() // called at the first ack of any job
	// anyJob counts acks in the order they come, whatever their stream
	// sequence: the first warm acks are the warm-up, the next measured
	// are timed.
	anyJob bool
	// cpuNow reads the CPU time the pipeline has used (nil: this
	// process's, processCPU).
	cpuNow func() time.Duration

	mu         sync.Mutex
	acked      map[uint64]uint64 // stream sequence -> NumDelivered of its ack
	nWarm      uint64
	nMeasured  uint64
	deliveries uint64
	naks       int
	tWarm      time.Time
	tEnd       time.Time
	cpuWarm    time.Duration // processCPU when the warm-up was acked
	cpuEnd     time.Duration // and when the last measured job was
	early      uint64        // measured jobs acked before the warm-up ended
	tFirst     time.Time     // the first ack of any job
	tLast      time.Time     // the last ack of a warm-up or measured job
	times      []time.Time   // every first ack of a job, in order
	done       chan struct{}
}

func newAckWatch(warm, measured int, onWarm func()) *ackWatch {
	return &ackWatch{warm: uint64(warm), measured: uint64(measured), onWarm: onWarm,
		acked: map[uint64]uint64{}, done: make(chan struct{})}
}

// subscribe watches stream's acks on nc.
func (a *ackWatch) subscribe(b testing.TB, nc *nats.Conn, stream string) {
	b.Helper()
	sub := subscribeUnbounded(b, nc, "$JS.ACK."+stream+".>", a.handle)
	b.Cleanup(func() { sub.Unsubscribe() })
}

// subscribeUnbounded subscribes h to subject on nc with no pending limit
// (a benchmark's watcher must not drop what it counts as a slow consumer)
// and returns once the server has the interest.
func subscribeUnbounded(b testing.TB, nc *nats.Conn, subject string, h nats.MsgHandler) *nats.Subscription {
	b.Helper()
	sub, err := nc.Subscribe(subject, h)
	if err != nil {
		b.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		b.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	return sub
}

func (a *ackWatch) handle(m *nats.Msg) {
	now := time.Now()
	// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>,
	// or with <domain>.<account hash> before <stream> (and a token after).
	t := strings.Split(m.Subject, ".")
	var delivered, seq uint64
	switch {
	case len(t) == 9:
		delivered, _ = strconv.ParseUint(t[4], 10, 64)
		seq, _ = strconv.ParseUint(t[5], 10, 64)
	case len(t) >= 11:
		delivered, _ = strconv.ParseUint(t[6], 10, 64)
		seq, _ = strconv.ParseUint(t[7], 10, 64)
	default:
		return
	}
	data := string(m.Data)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case data == "" || data == "+ACK":
	case strings.HasPrefix(data, "-NAK"):
		a.naks++
		return
	default: // +WPI, +NXT, +TERM
		return
	}
	if _, dup := a.acked[seq]; dup {
		return
	}
	a.acked[seq] = delivered
	if a.tFirst.IsZero() {
		a.tFirst = now
		if a.onFirst != nil {
			a.onFirst()
		}
	}
	a.tLast = now
	a.times = append(a.times, now)
	if a.anyJob {
		seq = uint64(len(a.acked)) // the order of arrival
	}
	switch {
	case seq <= a.warm:
		a.nWarm++
		if a.nWarm == a.warm {
			a.tWarm, a.cpuWarm, a.early = now, a.cpuTime(), a.nMeasured
			if a.onWarm != nil {
				a.onWarm()
			}
		}
	case seq <= a.warm+a.measured:
		a.nMeasured++
		a.deliveries += delivered
		if a.nMeasured == a.measured {
			a.tEnd, a.cpuEnd = now, a.cpuTime()
		}
	}
	if a.nWarm == a.warm && a.nMeasured == a.measured && a.done != nil {
		close(a.done)
		a.done = nil
	}
}

// wait waits until every job is acked and returns the measured time.
func (a *ackWatch) wait(b testing.TB, timeout time.Duration) (elapsed time.Duration, deliveries uint64, naks int) {
	b.Helper()
	a.mu.Lock()
	done := a.done
	a.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(timeout):
			a.mu.Lock()
			defer a.mu.Unlock()
			b.Fatalf("after %s: %d of %d warm-up and %d of %d measured jobs acked", timeout, a.nWarm, a.warm, a.nMeasured, a.measured)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	start := a.tWarm
	if a.warm == 0 {
		b.Fatal("ackWatch: no warm-up")
	}
	return a.tEnd.Sub(start), a.deliveries, a.naks
}

// curve is the time from the first ack at which each tenth of the jobs
// acked so far had been: where a pipeline's run is slow (its start, its
// steady pace, its last jobs).
func (a *ackWatch) curve() []time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.times)
	var c []time.Duration
	for i := 1; i <= 10 && n > 0; i++ {
		c = append(c, a.times[i*n/10-1].Sub(a.times[0]))
	}
	return c
}

// whole is the time from the first ack to the last, warm-up included: the
// rate of a run whose measured jobs overlap its warm-up (earlyAcks) is
// better read from it.
func (a *ackWatch) whole() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tLast.Sub(a.tFirst)
}

// earlyAcks is how many measured jobs were acked before the last warm-up
// job was: done before the clock started, they flatter the rate.
func (a *ackWatch) earlyAcks() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.early
}

// cpu is this process's CPU time over the measured window (after wait).
func (a *ackWatch) cpu() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cpuEnd - a.cpuWarm
}

// cpuTime is the pipeline's CPU time so far.
func (a *ackWatch) cpuTime() time.Duration {
	if a.cpuNow != nil {
		return a.cpuNow()
	}
	return processCPU()
}

// processCPU is the user and system time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rawServer starts a nats-server with JetStream storing under dir, as the
// raw pipeline's own (no project code).
func rawServer(b testing.TB, dir string) (*server.Server, *nats.Conn) {
	b.Helper()
	srv, err := server.NewServer(&server.Options{
		JetStream: true, StoreDir: dir, DontListen: true, NoSigs: true, NoLog: true,
		JetStreamMaxMemory: 256 << 20, MaxPayload: 8 << 20,
	})
	if err != nil {
		b.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		b.Fatal("raw nats-server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		b.Fatal(err)
	}
	return srv, nc
}

// rawJob is a job of the raw pipelines.
type rawJob struct {
	URL    string `json:"url"`
	Target string `json:"target"`
}

// rawGet is the raw pipelines' GET: the response of a 200, or an error.
func rawGet(hc *http.Client, url string) (*http.Response, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return resp, nil
}

// runRawPipeline drains bl with g goroutines and no project code: pull,
// GET, temp file, fsync, rename, fsync of the directory, ack.
func runRawPipeline(b *testing.B, bl benchBacklog, g int) pipelineResult {
	return runRaw(b, bl, g, "raw pipeline", func(dir string, hc *http.Client) func(rawJob) error {
		store, err := rawFileStore(dir, hc)
		if err != nil {
			b.Fatal(err)
		}
		return store
	})
}

// rawFileStore is the raw pipeline's store under dir/mirror: GET, temp
// file, fsync, rename, fsync of the directory.
func rawFileStore(dir string, hc *http.Client) (func(rawJob) error, error) {
	root := filepath.Join(dir, "mirror")
	tmp := filepath.Join(root, ".tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, err
	}
	var dirs sync.Map // directories known to exist
	return func(j rawJob) error {
		resp, err := rawGet(hc, j.URL)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		f, err := os.CreateTemp(tmp, "obj-*")
		if err != nil {
			return err
		}
		_, err = io.Copy(f, resp.Body)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(f.Name())
			return err
		}
		dst := filepath.Join(root, filepath.FromSlash(j.Target))
		parent := filepath.Dir(dst)
		if _, ok := dirs.Load(parent); !ok {
			if err := os.MkdirAll(parent, 0o755); err != nil {
				return err
			}
			dirs.Store(parent, true)
		}
		if err := os.Rename(f.Name(), dst); err != nil {
			return err
		}
		d, err := os.Open(parent)
		if err != nil {
			return err
		}
		err = d.Sync()
		d.Close()
		return err
	}, nil
}

// rawHTTPClient is the raw pipelines' HTTP client for g goroutines.
func rawHTTPClient(g int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns: 0, MaxIdleConnsPerHost: g, IdleConnTimeout: 90 * time.Second, DisableCompression: true,
	}}
}

// rawConsume runs g goroutines that take the consumer's messages, store
// each with store and ack it (a NAK on failure, reported to failed),
// until stop is called; stop returns once every goroutine has.
func rawConsume(cons jetstream.Consumer, g int, store func(rawJob) error, failed func(error)) (stop func(), err error) {
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * g))
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := it.Next()
				if err != nil {
					return // stopped
				}
				var j rawJob
				if err := json.Unmarshal(m.Data(), &j); err != nil {
					failed(err)
					m.Term()
					continue
				}
				if err := store(j); err != nil {
					failed(err)
					m.Nak()
					continue
				}
				m.Ack()
			}
		}()
	}
	return func() { it.Stop(); wg.Wait() }, nil
}

// runRaw drains bl with g goroutines of no project code, each storing a
// job with the store that newStore makes (given a scratch directory and
// the HTTP client to fetch with), and acking it. The backlog is stored
// first and the server restarted, as the worker's is; the clock is the ack
// watch's, on a connection of its own.
func runRaw(b *testing.B, bl benchBacklog, g int, name string, newStore func(dir string, hc *http.Client) func(rawJob) error) pipelineResult {
	b.Helper()
	dir := b.TempDir()
	ctx := context.Background()

	// The backlog, stored before the server restarts (as the worker's is).
	srv, nc := rawServer(b, filepath.Join(dir, "nats"))
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "RAW", jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxAckPending: 20000,
	}); err != nil {
		b.Fatal(err)
	}
	for i := range bl.total() {
		u, t := bl.job(i)
		data, _ := json.Marshal(rawJob{URL: u, Target: t})
		if _, err := js.PublishAsync("raw.jobs."+strconv.Itoa(i%bl.authorities), data); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("raw publish acks did not arrive")
	}
	nc.Close()
	srv.Shutdown()
	srv.WaitForShutdown()

	srv, nc = rawServer(b, filepath.Join(dir, "nats"))
	defer func() { nc.Close(); srv.Shutdown(); srv.WaitForShutdown() }()
	wnc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		b.Fatal(err)
	}
	defer wnc.Close()
	bl.origin.reset(b, bl.warm)
	watch := newAckWatch(bl.warm, bl.measured, nil)
	watch.subscribe(b, wnc, "RAW")
	if js, err = jetstream.New(nc); err != nil {
		b.Fatal(err)
	}
	cons, err := js.Consumer(ctx, "RAW", "raw")
	if err != nil {
		b.Fatal(err)
	}
	hc := rawHTTPClient(g)
	defer hc.CloseIdleConnections()
	store := newStore(dir, hc)

	var failed atomic.Int64
	stop, err := rawConsume(cons, g, store, func(err error) {
		failed.Add(1)
		b.Log(err)
	})
	if err != nil {
		b.Fatal(err)
	}
	elapsed, deliveries, naks := watch.wait(b, 10*time.Minute)
	stop()
	if failed.Load() > 0 || naks > 0 {
		b.Fatalf("%s: %d jobs failed", name, failed.Load())
	}
	return pipelineResult{measured: bl.measured, elapsed: elapsed, origin: bl.origin.stats(b), deliveries: deliveries, cpu: watch.cpu(),
		whole: watch.whole(), early: watch.earlyAcks(), curve: watch.curve()}
}

// runWorkerPipeline drains bl with `mirrorworker run` in-process: the
// backlog is stored first (the streams as run makes them), then run starts
// on the same data dir with the default flags, --floor 0 and args.
func runWorkerPipeline(b *testing.B, bl benchBacklog, args []string) pipelineResult {
	b.Helper()
	dataDir := b.TempDir()
	publishBacklog(b, dataDir, bl.total(), bl.job)
	return runWorkerOn(b, dataDir, bl, args, false)
}
