package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// env is a real embedded JetStream with the mirrorworker streams, the
// durable consumer and a file mirror target, all under one temp dir.
type env struct {
	t      testing.TB
	js     jetstream.JetStream
	cons   jetstream.Consumer
	target *mirror.FileTarget
	root   string
	// wrap, if set, wraps every consumer the harness hands a worker
	// (fakeNaks).
	wrap func(jetstream.Consumer) jetstream.Consumer
}

// consumer is c as the harness hands it to a worker.
func (e *env) consumer(c jetstream.Consumer) jetstream.Consumer {
	if e.wrap == nil {
		return c
	}
	return e.wrap(c)
}

func newEnv(t testing.TB, ackWait time.Duration) *env {
	t.Helper()
	dir := t.TempDir()
	js, _ := brokertest.JetStream(t, brokertest.Start(t, broker.EmbeddedOptions{StoreDir: filepath.Join(dir, "js")}))
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	cons, err := jobs.EnsureConsumer(ctx, js, &jobs.ConsumerOptions{AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "mirror")
	target, err := mirror.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, js: js, cons: cons, target: target, root: root}
}

// publish puts jobs on the stream and waits for every ack.
func (e *env) publish(js ...jobs.Job) {
	e.t.Helper()
	for i, j := range js {
		m, _, err := jobs.NewMsg(j)
		if err != nil {
			e.t.Fatalf("job %d: %v", i, err)
		}
		// A loaded machine can take longer than the default 200 ms to
		// ack the window of pending publishes: wait for room instead of
		// failing (TestParkingIsolationAtScale publishes 100,000).
		if _, err := e.js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			e.t.Fatalf("publish job %d: %v", i, err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		e.t.Fatal("publish acks did not arrive")
	}
}

// publishRaw puts arbitrary bytes on a subject.
func (e *env) publishRaw(subject string, data []byte) {
	e.t.Helper()
	if _, err := e.js.Publish(context.Background(), subject, data); err != nil {
		e.t.Fatal(err)
	}
}

// waitDrained waits until the consumer has nothing pending or unacked, as
// the stream's store says (jobs.Drained: its counters lag a publish).
func (e *env) waitDrained(timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	st, err := e.js.Stream(context.Background(), jobs.JobsStream)
	if err != nil {
		e.t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	for time.Now().Before(deadline) {
		var err error
		info, err = e.cons.Info(context.Background())
		if err != nil {
			e.t.Fatal(err)
		}
		drained, err := jobs.Drained(context.Background(), st, info)
		if err != nil {
			e.t.Fatal(err)
		}
		if drained {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("consumer not drained: pending %d, ack pending %d", info.NumPending, info.NumAckPending)
}

// deadLetters returns every record on MIRROR_DLQ.
func (e *env) deadLetters() []jobs.DeadLetter {
	e.t.Helper()
	ctx := context.Background()
	s, err := e.js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []jobs.DeadLetter
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			e.t.Fatal(err)
		}
		var d jobs.DeadLetter
		if err := json.Unmarshal(m.Data, &d); err != nil {
			e.t.Fatalf("dead letter %d: %v", seq, err)
		}
		out = append(out, d)
	}
	return out
}

// finals collects the worker's final outcomes.
type finals struct {
	mu  sync.Mutex
	all []worker.Final
	at  []time.Time // when each of all arrived
}

func (f *finals) add(x worker.Final) {
	f.mu.Lock()
	f.all = append(f.all, x)
	f.at = append(f.at, time.Now())
	f.mu.Unlock()
}

// lastAt returns when the last final that matches arrived.
func (f *finals) lastAt(match func(worker.Final) bool) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last time.Time
	for i, x := range f.all {
		if match(x) && f.at[i].After(last) {
			last = f.at[i]
		}
	}
	return last
}

func (f *finals) snapshot() []worker.Final {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]worker.Final(nil), f.all...)
}

func (f *finals) count(match func(worker.Final) bool) int {
	n := 0
	for _, x := range f.snapshot() {
		if match == nil || match(x) {
			n++
		}
	}
	return n
}

// waitFor waits until n finals match, and returns when that happened.
func (f *finals) waitFor(t testing.TB, n int, match func(worker.Final) bool, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		now := time.Now()
		got := f.count(match)
		if got >= n {
			return now
		}
		if now.After(deadline) {
			t.Fatalf("%d of %d jobs reached their outcome in %v", got, n, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// running is a worker started by start.
type running struct {
	w      *worker.Worker
	f      *finals
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, once done
}

func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		if r.err != nil {
			t.Errorf("Run: %v", r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// testPullWait is the pull expiry (worker.Options.PullWait) of the tests'
// workers unless a test sets one (d): a worker's Run waits for its pull to
// expire before it returns, and at the default (1 s) every test's stop
// took a second.
func testPullWait(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return 100 * time.Millisecond
}

func testLogger(t testing.TB) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	}
	return zerolog.Nop()
}

// start runs a worker on e with p and the given options.
func (e *env) start(p worker.Pacer, o worker.Options) *running {
	e.t.Helper()
	r := e.startWith(p, o, fetch.New(&fetch.Options{AllowPrivate: true}), e.target)
	e.waitReady(r.w)
	return r
}

// waitReady waits until w is bound to its consumers and pulling.
func (e *env) waitReady(w *worker.Worker) {
	e.t.Helper()
	waitCond(e.t, 10*time.Second, "the worker ready", func() bool { return w.Ready() == nil })
}

// counter reads a counter or the sum of a counter vector's series matching labels.
func counter(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// origin is a loopback HTTP origin that serves a deterministic body per
// path with an ETag, answers conditional requests with 304, and records
// every arrival. behave, if set, may answer instead.
type origin struct {
	srv  *httptest.Server
	auth string // "127.0.0.1:port"

	mu       sync.Mutex
	arrivals []arrival
	behave   func(w http.ResponseWriter, r *http.Request, n int) bool // n: requests so far for this path
	perPath  map[string]int
	served   atomic.Int64
}

type arrival struct {
	at     time.Time
	path   string
	status int
	cond   bool // a conditional request
}

func body(path string) []byte {
	return []byte(strings.Repeat("object "+path+"\n", 3))
}

func etag(b []byte) string {
	s := sha256.Sum256(b)
	return `"` + hex.EncodeToString(s[:8]) + `"`
}

func newOrigin(t testing.TB) *origin {
	o := &origin{perPath: map[string]int{}}
	o.srv = httptest.NewUnstartedServer(http.HandlerFunc(o.serve))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.srv.Listener = rxstamp.Serve(o.srv.Config, ln) // arrivals as this host received them
	o.srv.Start()
	t.Cleanup(o.srv.Close)
	o.auth = ln.Addr().String()
	return o
}

func (o *origin) url(path string) string { return "http://" + o.auth + path }

func (o *origin) serve(w http.ResponseWriter, r *http.Request) {
	now := rxstamp.Arrival(r)
	o.mu.Lock()
	o.perPath[r.URL.Path]++
	n := o.perPath[r.URL.Path]
	behave := o.behave
	o.mu.Unlock()
	rec := &statusRecorder{ResponseWriter: w}
	defer func() {
		o.mu.Lock()
		o.arrivals = append(o.arrivals, arrival{at: now, path: r.URL.Path, status: rec.status, cond: r.Header.Get("If-None-Match") != ""})
		o.mu.Unlock()
		o.served.Add(1)
	}()
	if behave != nil && behave(rec, r, n) {
		return
	}
	b := body(r.URL.Path)
	tag := etag(b)
	if r.Header.Get("If-None-Match") == tag {
		rec.WriteHeader(http.StatusNotModified)
		return
	}
	rec.Header().Set("ETag", tag)
	rec.Header().Set("Content-Length", fmt.Sprint(len(b)))
	rec.WriteHeader(http.StatusOK)
	rec.Write(b)
}

func (o *origin) setBehave(f func(w http.ResponseWriter, r *http.Request, n int) bool) {
	o.mu.Lock()
	o.behave = f
	o.mu.Unlock()
}

func (o *origin) log() []arrival {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]arrival(nil), o.arrivals...)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// checkFloor reports every pair of consecutive arrivals in log (any order)
// closer than floor less a slack of a third of it, naming the origin.
//
// Arrival times are taken at the origin, as the politeness rule is about
// what the origin sees. The pacer spaces grants; a request leaves its slot
// a little after its grant, and loopback plus the server's accept, parse
// and handler scheduling add more, so a correctly paced gap can look short
// when the earlier request was the slower one: on a loaded 2-core machine
// by tens of ms (a 140 ms gap was seen once). The slack excuses only that:
// it is subtracted from the floor (never added to a measured gap, no
// outlier is dropped), and two requests sent together would still show a
// gap near zero. The exact spacing, free of this noise, is checked on the
// worker's fake clock (TestFloorOnTheFakeClock).
func checkFloor(t testing.TB, name string, log []arrival, floor time.Duration) {
	t.Helper()
	minGap := checkGaps(t, name, log, floor, floor/3)
	t.Logf("%s: smallest gap between request arrivals %v", name, minGap)
}

// checkGaps fails t for every two consecutive arrivals in log (in the order
// they arrived) closer than floor less slack, and returns the smallest gap.
func checkGaps(t testing.TB, name string, log []arrival, floor, slack time.Duration) time.Duration {
	t.Helper()
	log = append([]arrival(nil), log...)
	sort.Slice(log, func(i, j int) bool { return log[i].at.Before(log[j].at) })
	minGap := time.Hour
	for i := 1; i < len(log); i++ {
		gap := log[i].at.Sub(log[i-1].at)
		minGap = min(minGap, gap)
		if gap < floor-slack {
			t.Errorf("%s: requests %d (%s) and %d (%s) arrived %v apart, floor %v", name, i-1, log[i-1].path, i, log[i].path, gap, floor)
		}
	}
	return minGap
}

// testPacer returns a pacer whose default floor and cap are floor and cap.
func testPacer(floor time.Duration, cap int, per map[string]pacer.Limits, quiet time.Duration, onEvent func(pacer.Event)) *pacer.Pacer {
	return pacer.New(&pacer.Options{
		Policy:      &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: cap}, Authorities: per},
		QuietWindow: quiet,
		OnEvent:     onEvent,
		AwaitSends:  true, // as the pipeline's: the worker reports writes
	})
}

// checkStored asserts that key holds exactly want.
func (e *env) checkStored(key string, want []byte) {
	e.t.Helper()
	got, err := os.ReadFile(filepath.Join(e.root, filepath.FromSlash(key)))
	if err != nil {
		e.t.Fatalf("read %s: %v", key, err)
	}
	if string(got) != string(want) {
		e.t.Fatalf("%s: stored %q, want %q", key, got, want)
	}
}

func isOutcome(outcome string) func(worker.Final) bool {
	return func(f worker.Final) bool { return f.Outcome == outcome }
}
