package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/fetch"
	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pipeline"
	"github.com/mirrorworker/mirrorworker/strategy"
	"github.com/mirrorworker/mirrorworker/stuborigin"
	"github.com/mirrorworker/mirrorworker/worker"
)

// The concrete types the load test wires satisfy the worker's interfaces
// (every strategy is a *pacer.Pacer, which worker.Pacer checks itself).
var (
	_ worker.Fetcher = (*fetch.Client)(nil)
	_ worker.Target  = (*mirror.FileTarget)(nil)
)

// Options configure Run. Jobs, Authorities, Workers, Profile and Strategies
// are required; every other zero field means its default.
type Options struct {
	Jobs        int
	Authorities int
	Workers     int
	// Skew is the share of the jobs on the hottest authority, in
	// [1/Authorities, 1]; 0 spreads the jobs evenly.
	Skew       float64
	Profile    *Profile
	Strategies []string
	// TimeLimit bounds each strategy's run; default 3 min.
	TimeLimit time.Duration
	// Concurrency is each worker's fetch slots; default 16.
	Concurrency int
	// InProcess runs the hostpacer strategy's workers in this process like
	// the other strategies'. By default the hostpacer runs as Workers
	// `mirrorworker run` processes (pods) on the partitioned cluster layout
	// of docs/adr/0007, as a deployment runs it; the other strategies are
	// not what `run` runs and are always in-process.
	InProcess bool
	// PodBinary is the mirrorworker executable the pods run; required
	// unless InProcess or no strategy is hostpacer.
	PodBinary string
	// PodLogLevel is the pods' --log-level; their log lines go to Logger at
	// their own level. Default "warn".
	PodLogLevel string
	// Shared makes every in-process worker pull from one durable consumer,
	// as `mirrorworker run` instances of earlier versions sharing a
	// deployment did. By default each in-process worker has its own
	// consumer filtered to a static share of the authorities (by akey,
	// docs/contract.md section 8), so that each authority is paced by
	// exactly one pacer. It does not apply to pods.
	Shared bool
	// Dir holds the per-strategy scratch directories (JetStream store,
	// mirror), each removed after its run; default the system temp dir.
	Dir string
	// TraceDir, when set, keeps each strategy's per-request trace in
	// TraceDir/<strategy>/: arrivals.log, one line per request as the
	// origin timed it (traceArrival), and each pod's departure log
	// (<pod>.departures). It is what tells which two requests made a gap
	// below the floor; the report has only the counts.
	TraceDir string

	// Curl configures the curl-retry reference client.
	Curl CurlOptions

	// Report metadata.
	Title       string
	Command     string
	ProfileFile string

	// Progress receives the live progress; nil discards it. Live means it is
	// a terminal: one line rewritten in place; otherwise a line every
	// ProgressEvery (default 5 s).
	Progress      io.Writer
	Live          bool
	ProgressEvery time.Duration
	// Logger receives the workers' and the origin's logs; zero discards.
	Logger zerolog.Logger
	// Now is the wall clock for the report's timestamp; default time.Now.
	Now func() time.Time
}

func (o *Options) check() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if o.Jobs < 1 {
		bad("jobs: want at least 1, got %d", o.Jobs)
	}
	if o.Authorities < 1 || o.Authorities > 10000 {
		bad("authorities: want 1 to 10000, got %d", o.Authorities)
	}
	if o.Workers < 1 || o.Workers > 64 {
		bad("workers: want 1 to 64, got %d", o.Workers)
	}
	if o.Skew != 0 && o.Authorities > 0 && (o.Skew < 1/float64(o.Authorities)-1e-9 || o.Skew > 1) {
		bad("skew: want 0 (even) or a share between 1/authorities (%.4g) and 1, got %v", 1/float64(o.Authorities), o.Skew)
	}
	if o.Profile == nil {
		bad("profile: required")
	}
	if len(o.Strategies) == 0 {
		bad("strategies: at least one")
	}
	if o.TimeLimit < 0 || o.Concurrency < 0 {
		bad("time limit and concurrency must not be negative")
	}
	if o.podsRun() && o.PodBinary == "" {
		bad("pod binary: the hostpacer runs as mirrorworker run processes; name the executable (or run in-process)")
	}
	return errors.Join(errs...)
}

// podsRun reports whether some strategy runs as pods.
func (o *Options) podsRun() bool {
	if o.InProcess {
		return false
	}
	for _, n := range o.Strategies {
		if n == strategy.HostPacer {
			return true
		}
	}
	return false
}

// Run runs one load test per strategy, one after the other, and returns the
// report. A strategy whose run cannot start gets a Result with Error set and
// the others still run. When ctx is cancelled Run stops the current
// strategy and returns what it has with ctx's error.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.TimeLimit == 0 {
		o.TimeLimit = 3 * time.Minute
	}
	if o.Concurrency == 0 {
		o.Concurrency = 16
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = 5 * time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Title == "" {
		o.Title = "mirrorworker load test"
	}
	if o.PodLogLevel == "" {
		o.PodLogLevel = "warn"
	}
	skew := o.Skew
	if skew == 0 {
		skew = 1 / float64(o.Authorities)
	}
	p := o.Profile
	r := &Report{
		Title:       o.Title,
		GeneratedAt: o.Now().UTC().Truncate(time.Second),
		Command:     o.Command,
		Setup: Setup{
			Jobs: o.Jobs, Authorities: o.Authorities, Workers: o.Workers, Skew: skew,
			Profile: p.Name, ProfileFile: o.ProfileFile, Scale: p.Scale,
			FloorSeconds: p.Floor.Seconds(), MaxInFlight: p.MaxInFlight,
			Identities:       1,
			Penalty:          penaltyLine(p.Origin.Penalty),
			AllowedRate:      p.AllowedRate(o.Authorities, 1),
			TimeLimitSeconds: o.TimeLimit.Seconds(), ObjectSize: p.ObjectSize,
			GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH, CPUs: runtime.NumCPU(),
		},
	}
	r.Notes = notes(o)
	for i, name := range o.Strategies {
		if ctx.Err() != nil {
			break
		}
		res := runStrategy(ctx, &o, name, fmt.Sprintf("%d/%d", i+1, len(o.Strategies)))
		r.Results = append(r.Results, res)
	}
	longest := 0.0
	for _, res := range r.Results {
		longest = math.Max(longest, res.DrainSeconds)
	}
	for t := 0; t <= int(math.Ceil(longest)); t++ {
		r.Setup.Allowance = append(r.Setup.Allowance, p.AllowedAdmissions(o.Authorities, 1, time.Duration(t)*time.Second))
	}
	return r, ctx.Err()
}

// penaltyLine describes the origin's penalty for the report, "" when off.
func penaltyLine(p *stuborigin.Penalty) string {
	if p == nil || p.After == 0 {
		return ""
	}
	return p.Describe()
}

func notes(o Options) []string {
	n := []string{
		"cpu s and peak heap are the whole load-test process during that strategy's run: in-process workers run with the stub origin and the embedded JetStream server, so the figures compare strategies but are not one worker's footprint (process CPU from getrusage, peak of /memory/classes/heap/objects:bytes sampled every 100 ms).",
		"All workers call from 127.0.0.1, so the origin sees one anonymous identity per authority; the allowed rate is the profile's anonymous sustained quota times the authorities.",
		scaleNote(o.Profile.Scale),
	}
	if o.podsRun() {
		n = append(n, fmt.Sprintf("hostpacer runs as %d mirrorworker run processes (pods, mode processes) on the partitioned cluster layout a deployment uses: MIRROR_JOBS in partitions by authority, one pod per partition through leases in MIRROR_LEASES, pacer facts shared through MIRROR_EVENTS, long waits parked in MIRROR_PARKED. Its run is measured from the first job published, once every pod holds its share of the partitions (startup s in report.json: process start, NATS connection, lease balancing). Its cpu s adds the pods' own CPU time (from their exit status) to the load-test process's; its heap MiB is the load-test process only (origin and JetStream), and each pod's peak RSS is in report.json (pods).", o.Workers),
			"sent<floor of the pods' row is timed by the pods themselves: each appends the wall-clock instant of every request it sends to a file, and the load test merges them per authority (one host, one clock), so it counts pairs closer than the floor across pods as well as within one.",
			"The other strategies are not what mirrorworker run runs: they stay in-process (mode in-process), each worker with its own pacer state.")
	}
	if slices.Contains(o.Strategies, strategy.CurlRetry) {
		retries := o.Curl.Retries
		if retries == 0 {
			retries = strategy.DefaultCurlRetries
		}
		spacing := "no spacing"
		if o.Curl.Spacing > 0 {
			spacing = fmt.Sprintf("at least %v between two requests to one authority (curl --rate)", o.Curl.Spacing)
		}
		n = append(n, fmt.Sprintf("curl-retry is the reference client, not a worker (mode reference): as curl --retry %d, one file at a time per authority, a transient answer retried after its Retry-After or 1, 2, 4... s, nothing kept from one file to the next, %s, no floor. It never runs at a compressed time: its waits are the origin's Retry-After and curl's own seconds. Its dead letters are files whose retries ran out.", retries, spacing))
	}
	if o.Shared {
		n = append(n, "In-process workers share one durable consumer: each authority is paced by every worker's pacer independently, so per-authority politeness holds per worker, not at the origin.")
	} else {
		n = append(n, "Each in-process worker has its own durable consumer filtered to a static share of the authorities (by akey), so each authority is paced by exactly one pacer.")
	}
	return n
}

// scaleNote says what the time scale hides, or, at real time, what the
// long constants cost.
func scaleNote(scale float64) string {
	if scale == 1 {
		return "Real time (scale 1): the strategies run at their contract constants. One throttling answer costs the HostPacer a 2 s interval that the answers after its probe bring back to the pace the origin admits (ADR 0029); cooldowns run their full 60-600 s. Values the origin sends (Retry-After, rate-limit resets) are the origin's own time."
	}
	return fmt.Sprintf("Time is compressed: the strategies' constants (2 s first step, 60 s fallback and cap, 600 s ceiling, 30 min quiet window, 15 min pause cap, 1-30 s backoff) are multiplied by the profile's scale (%g), which hides their cost: at scale 1 (mirrorworker loadtest --real-time) one throttling answer holds an authority at a 2 s interval for 30 min. The HostPacer scales the same constants (pacer.Options.Scale); values the origin sends (Retry-After, rate-limit resets) are never scaled.", scale)
}

// runStrategy runs one strategy from a fresh JetStream, origin and mirror:
// the HostPacer as pods (runPods) unless o.InProcess, every other strategy
// as in-process workers (runInProcess).
func runStrategy(ctx context.Context, o *Options, name, ordinal string) Result {
	res := Result{Strategy: name, Mode: ModeInProcess}
	pods := name == strategy.HostPacer && !o.InProcess
	reference := name == strategy.CurlRetry
	switch {
	case pods:
		res.Mode = ModeProcesses
	case reference:
		res.Mode = ModeReference
	}
	fail := func(err error) Result {
		res.Error = err.Error()
		fmt.Fprintf(o.Progress, "%s: %v\n", name, err)
		return res
	}
	p := o.Profile
	dir, err := os.MkdirTemp(o.Dir, "mirrorworker-loadtest-"+name+"-")
	if err != nil {
		return fail(fmt.Errorf("scratch dir: %w", err))
	}
	defer os.RemoveAll(dir)

	eo := broker.EmbeddedOptions{StoreDir: filepath.Join(dir, "nats"), Logger: o.Logger.With().Str("component", "nats-server").Logger()}
	if pods {
		eo.Listen = "127.0.0.1:0" // the pods connect with --nats-url
	}
	emb, err := broker.StartEmbedded(eo)
	if err != nil {
		return fail(err)
	}
	defer emb.Shutdown()
	nc, err := emb.Connect("loadtest "+name, broker.ClientLogOptions(o.Logger)...)
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(fmt.Errorf("jetstream: %w", err))
	}
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		return fail(fmt.Errorf("ensure streams: %w", err))
	}

	trace, err := openTrace(o.TraceDir, name)
	if err != nil {
		return fail(err)
	}
	defer trace.close()
	refusals := newRefusalLog()
	onArrival := refusals.arrival
	if ta := trace.arrival(); ta != nil {
		onArrival = func(a stuborigin.Arrival) { refusals.arrival(a); ta(a) }
	}
	og, err := stuborigin.New(p.Origin, &stuborigin.Options{
		Authorities: o.Authorities, GapFloor: p.Floor, OnArrival: onArrival, OnTold: refusals.toldHook,
		Logger: o.Logger.With().Str("component", "stub-origin").Logger(),
	})
	if err != nil {
		return fail(err)
	}
	urls, err := og.Start(ctx, "127.0.0.1:0")
	if err != nil {
		return fail(fmt.Errorf("start origin: %w", err))
	}
	defer og.Close()
	akeys := make([]string, len(urls))
	auths := make([]string, len(urls))
	for i, s := range urls {
		u, err := url.Parse(s)
		if err != nil {
			return fail(err)
		}
		a, err := authority.FromURL(u)
		if err != nil {
			return fail(err)
		}
		akeys[i] = a.Key()
		auths[i] = a.String()
	}
	r := &run{o: o, name: name, ordinal: ordinal, dir: dir, emb: emb, js: js, og: og, urls: urls, akeys: akeys, auths: auths,
		sent: newDepartures(), trace: trace, refusals: refusals}
	switch {
	case pods:
		err = r.pods(ctx, &res)
	case reference:
		err = r.curl(ctx, &res)
	default:
		err = r.inProcess(ctx, &res)
	}
	if err != nil {
		return fail(err)
	}
	return res
}

// run is one strategy's run once its JetStream and origin are up.
type run struct {
	o             *Options
	name, ordinal string
	dir           string
	emb           *broker.Embedded
	js            jetstream.JetStream
	og            *stuborigin.Origin
	urls, akeys   []string
	auths         []string // "host:port" of each authority, as departures name them
	sent          *departures
	trace         *trace // nil: no trace kept
	refusals      *refusalLog
}

// inProcess runs the strategy's workers in this process, each on its own
// durable consumer over a static share of the authorities, or all on one
// shared consumer.
func (r *run) inProcess(ctx context.Context, res *Result) error {
	o, js, name := r.o, r.js, r.name
	p := o.Profile
	// One durable consumer per worker over its partition of the
	// authorities, or one shared by all.
	durables := make([]string, o.Workers)
	created := map[string]bool{}
	for w := range o.Workers {
		co := &jobs.ConsumerOptions{Durable: jobs.ConsumerName}
		if !o.Shared {
			co.Durable = "loadtest-w" + strconv.Itoa(w)
			for a := w; a < len(r.akeys); a += o.Workers {
				co.FilterSubjects = append(co.FilterSubjects, jobs.JobsSubjectFilters("*", r.akeys[a])...)
			}
			if len(co.FilterSubjects) == 0 {
				continue // more workers than authorities: this one has nothing to do
			}
		}
		durables[w] = co.Durable
		if created[co.Durable] {
			continue
		}
		if _, err := jobs.EnsureConsumer(ctx, js, co); err != nil {
			return err
		}
		created[co.Durable] = true
	}

	if err := enqueue(ctx, js, r.urls, spread(o.Jobs, len(r.urls), o.Skew), p.ObjectSize); err != nil {
		return err
	}

	target, err := mirror.Open(filepath.Join(r.dir, "mirror"))
	if err != nil {
		return err
	}
	type instance struct {
		w     *worker.Worker
		nc    *nats.Conn
		parts *pipeline.Parts
	}
	var insts []instance
	defer func() {
		for _, in := range insts {
			if in.parts != nil {
				in.parts.Close()
			}
			in.nc.Close()
		}
	}()
	for w, durable := range durables {
		if durable == "" {
			continue
		}
		wnc, err := r.emb.Connect(fmt.Sprintf("loadtest %s worker %d", name, w), broker.ClientLogOptions(o.Logger)...)
		if err != nil {
			return err
		}
		insts = append(insts, instance{nc: wnc})
		wjs, err := jetstream.New(wnc)
		if err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
		cons, err := wjs.Consumer(ctx, jobs.JobsStream, durable)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", durable, err)
		}
		pc, err := strategy.New(name, strategy.Options{Floor: floorOption(p.Floor), MaxInFlight: p.MaxInFlight, Scale: p.Scale})
		if err != nil {
			return err
		}
		id := fmt.Sprintf("loadtest-%s-%d", name, w)
		parts, err := pipeline.New(wjs, pipeline.Config{
			Concurrency: o.Concurrency,
			WorkerID:    id,
			Pacer:       pc,
			Fetch:       &fetch.Options{AllowPrivate: true, UserAgent: "mirrorworker-loadtest"},
			Logger:      o.Logger.With().Str("worker_id", id).Logger(),
		})
		if err != nil {
			return err
		}
		insts[len(insts)-1].parts = parts
		wk, err := parts.NewWorker(cons, target, 2*time.Second, func(_ *worker.Options, d *worker.Deps) {
			r.sent.wrap(id, d)
		})
		if err != nil {
			return err
		}
		insts[len(insts)-1].w = wk
	}

	// Measure from here: the workers start on a queue that is full.
	m := r.startMeasure()
	wctx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for _, in := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := in.parts.Run(wctx, in.w.Run, nil); err != nil {
				o.Logger.Error().Err(err).Str("strategy", name).Msg("worker stopped with an error")
			}
		}()
	}
	read := func(ctx context.Context) (queueSnap, error) { return queueState(ctx, js, created) }
	m.watch(ctx, read)
	stopWorkers()
	wg.Wait()
	m.finish(ctx, res, read, 0)
	return nil
}

// pods runs the HostPacer as o.Workers `mirrorworker run` processes on the
// partitioned cluster layout (docs/adr/0007), as a deployment runs it:
// they share the load test's JetStream, the mirror and one pace per origin.
// The run is measured from the first job published, once every pod holds
// its share of the partitions.
func (r *run) pods(ctx context.Context, res *Result) error {
	o, js := r.o, r.js
	if o.PodBinary == "" {
		return errNoBinary
	}
	partitions, err := jobs.EnsureWork(ctx, js, nil)
	if err != nil {
		return fmt.Errorf("ensure work streams: %w", err)
	}
	if o.Workers > partitions {
		return fmt.Errorf("%d pods: at most %d (one partition each at least); use --in-process for more workers", o.Workers, partitions)
	}
	mirrorDir := filepath.Join(r.dir, "mirror")
	podsDir := filepath.Join(r.dir, "pods")
	t0 := time.Now()
	pods, err := startPods(ctx, o, js, r.name, r.emb.ClientURL(), podsDir, mirrorDir, partitions)
	if err != nil {
		return err
	}
	res.StartupSeconds = time.Since(t0).Seconds()
	stopped := false
	stopAll := func() {
		if stopped {
			return
		}
		stopped = true
		var wg sync.WaitGroup
		for _, p := range pods {
			wg.Go(p.stop)
		}
		wg.Wait()
	}
	defer stopAll()

	m := r.startMeasure()
	defer m.peak.stop() // on an error before finish
	if err := enqueue(ctx, js, r.urls, spread(o.Jobs, len(r.urls), o.Skew), o.Profile.ObjectSize); err != nil {
		return err
	}
	read := partitionedQueue(js)
	exited := func() error {
		for _, p := range pods {
			select {
			case <-p.exited:
				return p.failure()
			default:
			}
		}
		return nil
	}
	m.exited = exited
	m.watch(ctx, read)
	stopAll()
	var podCPU float64
	for _, p := range pods {
		pr, err := p.result(r.sent)
		if err != nil {
			return err
		}
		if err := r.trace.keep(p.departures, p.id+".departures"); err != nil {
			return err
		}
		if err := r.trace.keep(p.departures+departlog.WritesSuffix, p.id+".writes"); err != nil {
			return err
		}
		if err := r.trace.keep(p.departures+departlog.ReadsSuffix, p.id+".reads"); err != nil {
			return err
		}
		podCPU += pr.CPUSeconds
		res.Pods = append(res.Pods, pr)
	}
	m.finish(ctx, res, read, podCPU)
	if m.died != nil {
		res.Error = m.died.Error()
	}
	return nil
}

// measure is one run's measurement, from startMeasure to finish.
type measure struct {
	r     *run
	start time.Time
	cpu0  float64
	peak  *heapSampler
	prog  *progress
	// exited, if set, reports a worker process that died; the watch stops.
	exited func() error
	died   error

	drained bool
	drain   time.Duration
	snap    queueSnap
}

func (r *run) startMeasure() *measure {
	runtime.GC()
	m := &measure{r: r, cpu0: cpuSeconds(), peak: startHeapSampler(), start: time.Now()}
	m.prog = &progress{w: r.o.Progress, live: r.o.Live, every: r.o.ProgressEvery, name: r.name, ordinal: r.ordinal, total: r.o.Jobs, start: m.start}
	return m
}

func (m *measure) watch(ctx context.Context, read func(context.Context) (queueSnap, error)) {
	m.drained, m.snap, m.died = watch(ctx, read, m.exited, m.r.og, m.r.o.Jobs, m.start.Add(m.r.o.TimeLimit), m.prog)
	m.drain = time.Since(m.start)
}

// finish fills res once the workers have stopped; extraCPU is CPU time
// spent outside this process (the pods').
func (m *measure) finish(ctx context.Context, res *Result, read func(context.Context) (queueSnap, error), extraCPU float64) {
	o, p := m.r.o, m.r.o.Profile
	res.CPUSeconds = cpuSeconds() - m.cpu0 + extraCPU
	res.PeakHeapBytes = m.peak.stop()
	m.prog.finish(m.snap, m.drained)

	// The final counts, after the workers handed their jobs back.
	snap := m.snap
	if s, err := read(context.WithoutCancel(ctx)); err == nil {
		snap = s
	}
	st := m.r.og.Stats()
	drain := m.drain
	res.Drained = m.drained
	res.DrainSeconds = drain.Seconds()
	res.DeadLettered = snap.dead
	res.JobsStored = snap.finished(o.Jobs) - snap.dead
	res.JobsPerSec = float64(res.JobsStored) / drain.Seconds()
	res.DeliveriesPerJob = float64(snap.deliveries) / float64(o.Jobs)
	fillOrigin(res, st, m.start, drain)
	if allowed := p.AllowedAdmissions(o.Authorities, 1, drain); allowed > 0 {
		res.Goodput = float64(res.Admitted) / allowed
	}
	starts := m.r.sent.byIndex(m.r.auths)
	res.DeparturesLogged = starts != nil
	res.EarlyTold, res.EarlyCrossed, res.EarlyToldUnread, res.EarlyRequests = m.r.refusals.split(starts, m.r.sent.byClient(m.r.auths), m.start)
	if m.r.trace != nil {
		if err := m.r.refusals.writeTrace(m.r.trace.dir, res.EarlyRequests); err != nil {
			o.Logger.Warn().Err(err).Msg("early trace not written")
		}
	}
	var minSent time.Duration
	res.SentGapsBelowFloor, minSent = m.r.sent.belowFloor(p.Floor)
	if minSent >= 0 {
		res.MinSentGapSeconds = minSent.Seconds()
	}
}

// floorOption maps a policy floor onto strategy.Options, where zero means
// the default.
func floorOption(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// spread returns how many jobs go to each authority: skew of them on the
// first (the hottest), the rest evenly over the others; 0 is even.
func spread(n, a int, skew float64) []int {
	out := make([]int, a)
	if skew == 0 || a == 1 {
		for i := range out {
			out[i] = n / a
			if i < n%a {
				out[i]++
			}
		}
		return out
	}
	hot := int(math.Round(skew * float64(n)))
	out[0] = hot
	rest := n - hot
	for i := 1; i < a; i++ {
		out[i] = rest / (a - 1)
		if i-1 < rest%(a-1) {
			out[i]++
		}
	}
	return out
}

// queued is one job of a run and the index of its authority.
type queued struct {
	a int
	j jobs.Job
}

// jobList is a run's jobs, interleaved over the authorities (the stream is
// not sorted by authority in real life either), numbered in that order.
func jobList(urls []string, counts []int, size int64) []queued {
	left := append([]int(nil), counts...)
	var out []queued
	seq := 0
	for more := true; more; {
		more = false
		for a := range urls {
			if left[a] == 0 {
				continue
			}
			more = true
			left[a]--
			seq++
			out = append(out, queued{a: a, j: jobs.Job{
				URL:    fmt.Sprintf("%s/objects/%d/%06d.bin?size=%d", urls[a], a, seq, size),
				Target: fmt.Sprintf("a%04d/%06d.bin", a, seq),
			}})
		}
	}
	return out
}

// jobURLs is jobList's URLs by authority, in order: the files the
// reference client fetches, the same the workers get.
func jobURLs(urls []string, counts []int, size int64) [][]string {
	out := make([][]string, len(urls))
	for _, q := range jobList(urls, counts, size) {
		out[q.a] = append(out[q.a], q.j.URL)
	}
	return out
}

// enqueue publishes the jobs of jobList and waits for every ack.
func enqueue(ctx context.Context, js jetstream.JetStream, urls []string, counts []int, size int64) error {
	var futures []jetstream.PubAckFuture
	for i, q := range jobList(urls, counts, size) {
		m, _, err := jobs.NewMsg(q.j)
		if err != nil {
			return fmt.Errorf("job %d: %w", i+1, err)
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("publish job %d: %w", i+1, err)
		}
		futures = append(futures, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Minute):
		return errors.New("enqueue: the stream did not ack every job within 2 minutes")
	}
	for _, f := range futures {
		select {
		case err := <-f.Err():
			return fmt.Errorf("publish: %w", err)
		default:
		}
	}
	return nil
}

// queueSnap is the queue's state summed over the consumers.
type queueSnap struct {
	pending, ackPending uint64
	// unsignalled counts the consumers that read empty (0 pending, 0 ack
	// pending) with jobs still stored for them: the server had not yet
	// counted a burst just published (jobs.Drained).
	unsignalled int
	deliveries  uint64
	dead        int
	rateLimited int64 // from the origin, for the progress line
	unavailable int64
	bans        int64
}

func (s queueSnap) finished(total int) int {
	f := total - int(s.pending) - int(s.ackPending)
	return max(f, 0)
}

// empty reports whether every job has left the queue.
func (s queueSnap) empty() bool {
	return s.pending == 0 && s.ackPending == 0 && s.unsignalled == 0
}

// add sums consumer ci into s.
func (s *queueSnap) add(ci *jetstream.ConsumerInfo) {
	s.pending += ci.NumPending
	s.ackPending += uint64(ci.NumAckPending)
	s.deliveries += ci.Delivered.Consumer
}

// sumConsumers sums the consumers in infos of stream into s, and when
// their counts sum to nothing, counts those that hold jobs the server has
// not counted yet (jobs.Unsignalled).
func (s *queueSnap) sumConsumers(ctx context.Context, stream jetstream.Stream, infos []*jetstream.ConsumerInfo) error {
	for _, ci := range infos {
		s.add(ci)
	}
	if s.pending > 0 || s.ackPending > 0 {
		return nil
	}
	var err error
	s.unsignalled, err = jobs.Unsignalled(ctx, stream, infos)
	return err
}

// queueState reads the in-process workers' consumers on MIRROR_JOBS.
func queueState(ctx context.Context, js jetstream.JetStream, durables map[string]bool) (queueSnap, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var s queueSnap
	st, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		return s, fmt.Errorf("stream %s: %w", jobs.JobsStream, err)
	}
	var infos []*jetstream.ConsumerInfo
	for d := range durables {
		c, err := st.Consumer(ctx, d)
		if err != nil {
			return s, fmt.Errorf("consumer %s: %w", d, err)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return s, fmt.Errorf("consumer %s info: %w", d, err)
		}
		infos = append(infos, ci)
	}
	if err := s.sumConsumers(ctx, st, infos); err != nil {
		return s, err
	}
	return s, readDead(ctx, js, &s)
}

// readDead sets s.dead from the dead-letter stream.
func readDead(ctx context.Context, js jetstream.JetStream, s *queueSnap) error {
	dlq, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", jobs.DLQStream, err)
	}
	si, err := dlq.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s info: %w", jobs.DLQStream, err)
	}
	s.dead = int(si.State.Msgs)
	return nil
}

// The queue is read every watchEvery, and every watchEveryAtEnd once at
// most watchEndJobs jobs are left in it: the drain's time is the read that
// found it empty, and a quarter of a second of resolution is 0.8% of a
// 30 s drain, as much as a politeness cell's margin to its bound. Reading
// the consumers 50 times a second for the last jobs' few hundred
// milliseconds costs the workers nothing they would notice; for the whole
// run it would.
const (
	watchEvery      = 250 * time.Millisecond
	watchEveryAtEnd = 20 * time.Millisecond
	watchEndJobs    = 8
)

// watch polls the queue until every job has left it, the deadline passes,
// ctx is cancelled or exited (if set) reports a dead worker process,
// updating the progress line. It reports whether the queue drained, and the
// error of a dead worker process.
func watch(ctx context.Context, read func(context.Context) (queueSnap, error), exited func() error, og *stuborigin.Origin, total int, deadline time.Time, prog *progress) (bool, queueSnap, error) {
	tick := time.NewTimer(watchEvery)
	defer tick.Stop()
	var (
		last queueSnap
		seen bool // last holds a real reading: a zero queueSnap looks drained
	)
	for {
		if s, err := read(ctx); err == nil {
			last, seen = s, true
		}
		if seen && last.empty() {
			return true, last, nil
		}
		if exited != nil {
			if err := exited(); err != nil {
				return false, last, err
			}
		}
		now := time.Now()
		if !now.Before(deadline) {
			return false, last, nil
		}
		if prog.due(now) {
			last.rateLimited, last.unavailable, last.bans = originRejections(og)
			prog.update(now, last)
		}
		tick.Reset(watchNext(last, seen))
		select {
		case <-ctx.Done():
			return false, last, nil
		case <-tick.C:
		}
	}
}

// watchNext is the wait before the next read of the queue, given the last
// one (seen: it is a real reading).
func watchNext(last queueSnap, seen bool) time.Duration {
	if seen && last.pending+last.ackPending <= watchEndJobs {
		return watchEveryAtEnd
	}
	return watchEvery
}

func originRejections(og *stuborigin.Origin) (r429, r503, bans int64) {
	for _, a := range og.Stats().Authorities {
		r429 += a.RateLimited
		r503 += a.CapacityExhausted
		bans += a.Penalty.Bans
	}
	return r429, r503, bans
}

// fillOrigin copies what the origin saw into res: its counts, the gaps and
// the timeline from the workers' start to the end of the run.
func fillOrigin(res *Result, st stuborigin.Stats, start time.Time, drain time.Duration) {
	var admitted int64
	minGap := time.Duration(-1)
	offset := int(start.Sub(st.Start) / time.Second)
	// The run covers [start, start+drain] in the origin's seconds; the
	// series starts at the whole second the start falls in, so it needs
	// the seconds up to the one the end falls in (ceil(drain) alone would
	// drop the run's last fraction of a second when the start's is larger).
	secs := int(math.Ceil((start.Sub(st.Start) + drain).Seconds())) - offset
	series := make([]Point, secs)
	for i := range series {
		series[i].T = i
	}
	for _, a := range st.Authorities {
		res.Requests += a.Requests
		admitted += a.Admitted
		res.Status429 += a.RateLimited
		res.Status503 += a.CapacityExhausted
		res.Status403 += a.Forbidden
		res.Bans += a.Penalty.Bans
		res.BannedSeconds += a.Penalty.BannedSeconds
		res.RequestsDuringBans += a.Penalty.DuringBans
		res.Tarpitted += a.Penalty.Tarpitted
		res.TarpitSeconds += a.Penalty.TarpitSeconds
		// Periods use the series' whole-second offset, so that they line
		// up with its bars.
		for _, b := range a.BanPeriods {
			bp := BanPeriod{Authority: a.Index, Start: b.Start - float64(offset), End: b.End - float64(offset)}
			res.BanPeriods = append(res.BanPeriods, bp)
			addBanned(series, bp)
		}
		res.Early += a.Early
		res.AuthorityGapsBelowFloor += a.BelowFloor
		for k, v := range a.Reasons {
			if res.Rejections == nil {
				res.Rejections = map[string]int64{}
			}
			res.Rejections[k] += v
		}
		for _, id := range a.Identities {
			res.GapsBelowFloor += id.BelowFloor
			if id.GapCount > 0 && (minGap < 0 || id.MinGap < minGap) {
				minGap = id.MinGap
			}
		}
		for _, sec := range a.Timeline {
			t := sec.T - offset
			if t < 0 || t >= len(series) {
				continue
			}
			series[t].Requests += sec.Requests
			series[t].Admitted += sec.Admitted
			series[t].Status429 += sec.RateLimited
			series[t].Status503 += sec.CapacityExhausted
			series[t].Status403 += sec.Forbidden
		}
	}
	if minGap >= 0 {
		res.MinGapSeconds = minGap.Seconds()
	}
	res.Admitted = admitted
	res.AdmittedPerSec = float64(admitted) / drain.Seconds()
	res.Series = series
	sort.Slice(res.BanPeriods, func(i, j int) bool { return res.BanPeriods[i].Start < res.BanPeriods[j].Start })
}

// addBanned adds b's share of each second of series to its Banned.
func addBanned(series []Point, b BanPeriod) {
	for i := max(int(math.Floor(b.Start)), 0); i < len(series) && float64(i) < b.End; i++ {
		lo, hi := math.Max(b.Start, float64(i)), math.Min(b.End, float64(i+1))
		if hi > lo {
			series[i].Banned += hi - lo
		}
	}
}
