package main

// Process-level tests of `mirrorworker run`: the real binary (this test
// binary re-executed as main, see TestMain) against a JetStream server the
// test owns, so that the stream outlives the worker processes. SIGTERM and
// SIGKILL are real signals.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
)

// asMainEnv makes the test binary behave as the mirrorworker command. It is
// not a MIRRORWORKER_ variable, so it can never be read as a flag.
const asMainEnv = "MW_TEST_BINARY_AS_MAIN"

// TestMain lets the process tests run the command as a child process without
// building and linking a second binary: the child is this test binary with
// asMainEnv set, so it runs exactly the code (and build flags) under test.
func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	if spec := os.Getenv(benchRawEnv); spec != "" {
		if err := rawChildMain(spec); err != nil {
			fmt.Fprintln(os.Stderr, "raw pipeline:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if spec := os.Getenv(benchOriginEnv); spec != "" {
		if err := benchOriginMain(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench origin:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	setLogFormats() // as main does, so in-process runs log alike
	os.Exit(m.Run())
}

// startInfo is what the worker's start line tells a newcomer, and the tests
// where to find it.
type startInfo struct {
	Msg      string `json:"message"`
	NATSURL  string `json:"nats_url"`
	AdminURL string `json:"admin_url"`
	Mirror   string `json:"mirror"`
}

// logWatch is an io.Writer for the worker's JSON log: it keeps every line
// (shown when a test fails) and delivers the start line once. Safe for
// concurrent use.
type logWatch struct {
	started chan startInfo

	mu      sync.Mutex
	partial []byte
	lines   []string
	sent    bool
}

func newLogWatch() *logWatch { return &logWatch{started: make(chan startInfo, 1)} }

func (l *logWatch) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		l.lines = append(l.lines, line)
		var si startInfo
		if !l.sent && json.Unmarshal([]byte(line), &si) == nil && si.Msg == startMessage {
			l.sent = true
			l.started <- si
		}
	}
	return len(p), nil
}

// field returns the string field key of the first line with message msg.
func (l *logWatch) field(msg, key string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["message"] == msg {
			s, _ := m[key].(string)
			return s
		}
	}
	return ""
}

// messages returns the lines whose message is msg.
func (l *logWatch) messages(msg string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		var m struct {
			Message string `json:"message"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.Message == msg {
			out = append(out, line)
		}
	}
	return out
}

func (l *logWatch) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n") + string(l.partial)
}

// waitStart waits for the start line or for exited (the worker gave up).
func (l *logWatch) waitStart(t *testing.T, exited <-chan struct{}) startInfo {
	t.Helper()
	select {
	case si := <-l.started:
		return si
	case <-exited:
		t.Fatalf("worker exited before its start line; log:\n%s", l)
	case <-time.After(30 * time.Second):
		t.Fatalf("no start line after 30s; log:\n%s", l)
	}
	panic("unreachable")
}

// objectOrigin serves deterministic objects at /obj/<n> with strong ETags,
// answering If-None-Match with 304, and counts what it serves.
type objectOrigin struct {
	*httptest.Server
	delay atomic.Int64 // nanoseconds before each answer
	// hang: requests for these paths wait until their client goes away or
	// hang is cleared (set to nil).
	hang atomic.Pointer[map[string]bool]

	requests   atomic.Int64 // every request, whatever its answer
	inflight   atomic.Int64
	hungNow    atomic.Int64
	full200    atomic.Int64 // 200s whose body was written completely
	notModfied atomic.Int64
	released   chan struct{}
	once       sync.Once
}

func objectBody(n int) []byte {
	size := 1 + (n*7919)%(96<<10)
	b := make([]byte, size)
	for i := range b {
		b[i] = byte((i*31 + n*17) ^ (i >> 8))
	}
	return b
}

func objectETag(n int) string {
	sum := sha256.Sum256(objectBody(n))
	return `"` + hex.EncodeToString(sum[:8]) + `"`
}

func newObjectOrigin(t *testing.T) *objectOrigin {
	o := &objectOrigin{released: make(chan struct{})}
	o.Server = httptest.NewServer(http.HandlerFunc(o.serve))
	t.Cleanup(func() {
		o.release()
		o.Server.CloseClientConnections()
		o.Server.Close()
	})
	return o
}

// release ends every hung request and stops hanging new ones.
func (o *objectOrigin) release() {
	o.hang.Store(nil)
	o.once.Do(func() { close(o.released) })
}

func (o *objectOrigin) serve(w http.ResponseWriter, r *http.Request) {
	o.requests.Add(1)
	o.inflight.Add(1)
	defer o.inflight.Add(-1)
	n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/obj/"))
	if err != nil || !strings.HasPrefix(r.URL.Path, "/obj/") {
		http.NotFound(w, r)
		return
	}
	if h := o.hang.Load(); h != nil && (*h)[r.URL.Path] {
		o.hungNow.Add(1)
		defer o.hungNow.Add(-1)
		// Send half the body first: a worker stopped now holds a partial
		// download, which must never show up in the mirror.
		body := objectBody(n)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Header().Set("ETag", objectETag(n))
		w.WriteHeader(http.StatusOK)
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-o.released:
		}
		w.Write(body[len(body)/2:])
		o.full200.Add(1)
		return
	}
	if d := time.Duration(o.delay.Load()); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-r.Context().Done():
			return
		case <-timer.C:
		}
	}
	etag := objectETag(n)
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		o.notModfied.Add(1)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body := objectBody(n)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if _, err := w.Write(body); err == nil {
		o.full200.Add(1)
	}
}

// objectKey is the mirror key job n is stored under.
func objectKey(n int) string { return fmt.Sprintf("objects/%03d.bin", n) }

// publishObjects publishes jobs 0..n-1 for origin o, creating the streams
// first (as enqueue does) so that jobs can be queued before any worker runs.
func publishObjects(t *testing.T, natsURL string, o *objectOrigin, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{KeepExisting: true}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		raw := fmt.Sprintf(`{"url":%q,"target":%q}`, fmt.Sprintf("%s/obj/%d", o.URL, i), objectKey(i))
		j, err := jobs.Parse([]byte(raw))
		if err != nil {
			t.Fatalf("job %s: %v", raw, err)
		}
		if _, err := js.Publish(ctx, j.Subject(), []byte(raw), jetstream.WithMsgID(j.ID)); err != nil {
			t.Fatalf("publish job %d: %v", i, err)
		}
	}
}

// mirrorFiles lists the files outside .mirrorworker/ with their contents.
func mirrorFiles(t *testing.T, root string) map[string][]byte {
	t.Helper()
	got := map[string][]byte{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel == ".mirrorworker" {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) { // renamed over while we walked
			return nil
		}
		if err != nil {
			return err
		}
		got[filepath.ToSlash(rel)] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// checkMirror fails unless every file outside .mirrorworker/ is one of jobs
// 0..n-1 with exactly its bytes. It returns how many are there.
func checkMirror(t *testing.T, root string, n int) int {
	t.Helper()
	files := mirrorFiles(t, root)
	for key, b := range files {
		var i int
		if _, err := fmt.Sscanf(key, "objects/%03d.bin", &i); err != nil || i < 0 || i >= n || key != objectKey(i) {
			t.Errorf("unexpected file in the mirror: %s (%d bytes)", key, len(b))
			continue
		}
		if want := objectBody(i); !bytes.Equal(b, want) {
			t.Errorf("%s: %d bytes, want %d bytes exactly as served", key, len(b), len(want))
		}
	}
	return len(files)
}

// checkMeta checks, once no worker runs, that each object's metadata names
// its job and describes exactly the stored bytes: one store per job.
func checkMeta(t *testing.T, root string, o *objectOrigin, n int) {
	t.Helper()
	target, err := mirror.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		m, err := target.Stat(context.Background(), objectKey(i))
		if err != nil {
			t.Errorf("%s: metadata: %v", objectKey(i), err)
			continue
		}
		body := objectBody(i)
		sum := sha256.Sum256(body)
		wantID := jobs.DefaultID(fmt.Sprintf("%s/obj/%d", o.URL, i), objectKey(i))
		if m.SHA256 != hex.EncodeToString(sum[:]) || m.Size != int64(len(body)) || m.JobID != wantID || m.ETag != objectETag(i) {
			t.Errorf("%s: metadata %+v, want sha256 %x, size %d, job %s, etag %s", objectKey(i), m, sum, len(body), wantID, objectETag(i))
		}
	}
}

type queueState struct {
	pending, ackPending, dlq uint64
}

// addConsumers counts the consumers in infos of stream into q. When their
// counts sum to nothing, one that holds a job the server has not counted
// yet (jobs.Unsignalled) counts as one pending.
func (q *queueState) addConsumers(ctx context.Context, stream jetstream.Stream, infos []*jetstream.ConsumerInfo) error {
	for _, ci := range infos {
		q.pending += ci.NumPending
		q.ackPending += uint64(ci.NumAckPending)
	}
	if q.pending > 0 || q.ackPending > 0 {
		return nil
	}
	n, err := jobs.Unsignalled(ctx, stream, infos)
	q.pending += uint64(n)
	return err
}

func readQueue(ctx context.Context, js jetstream.JetStream) (queueState, error) {
	var q queueState
	if _, err := js.Consumer(ctx, jobs.JobsStream, jobs.PartitionConsumer(0)); err == nil {
		// Partitioned mode: one consumer per partition on MIRROR_JOBS, and
		// parked jobs wait in MIRROR_PARKED.
		s, err := js.Stream(ctx, jobs.JobsStream)
		if err != nil {
			return q, err
		}
		n, err := jobs.PartitionsOf(s.CachedInfo().Config)
		if err != nil {
			return q, err
		}
		// Jobs wait in the partition consumers, lanes and catch-up
		// consumers (jobs.HoldsJobs), and parked in MIRROR_PARKED.
		parts := 0
		var infos []*jetstream.ConsumerInfo
		cl := s.ListConsumers(ctx)
		for ci := range cl.Info() {
			if !jobs.HoldsJobs(ci.Name) {
				continue
			}
			if strings.HasPrefix(ci.Name, jobs.PartitionConsumerPrefix) {
				parts++
			}
			infos = append(infos, ci)
		}
		if err := cl.Err(); err != nil {
			return q, err
		}
		if err := q.addConsumers(ctx, s, infos); err != nil {
			return q, err
		}
		if parts != n {
			return q, fmt.Errorf("%d partition consumers of %d", parts, n)
		}
		ps, err := js.Stream(ctx, jobs.ParkStream)
		if err != nil {
			return q, err
		}
		pi, err := ps.Info(ctx)
		if err != nil {
			return q, err
		}
		q.pending += pi.State.Msgs
	} else {
		s, err := js.Stream(ctx, jobs.JobsStream)
		if err != nil {
			return queueState{}, err
		}
		c, err := s.Consumer(ctx, jobs.ConsumerName)
		if err != nil {
			return queueState{}, err
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return queueState{}, err
		}
		if err := q.addConsumers(ctx, s, []*jetstream.ConsumerInfo{ci}); err != nil {
			return queueState{}, err
		}
	}
	s, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		return queueState{}, err
	}
	si, err := s.Info(ctx)
	if err != nil {
		return queueState{}, err
	}
	q.dlq = si.State.Msgs
	return q, nil
}

// waitDrained polls until all n objects are in the mirror and the consumer
// has nothing pending or unacked, or fails after the deadline.
func waitDrained(t *testing.T, natsURL, root string, n int, deadline time.Duration, logs fmt.Stringer) {
	t.Helper()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var (
		q      queueState
		stored int
		qerr   error
	)
	for {
		stored = len(mirrorFiles(t, root))
		// Each read has its own timeout: a request lost while a stream or
		// consumer elects a new leader is never answered.
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		q, qerr = readQueue(rctx, js)
		rcancel()
		if qerr == nil && stored == n && q.pending == 0 && q.ackPending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("not drained after %s: %d/%d stored, queue %+v (err %v); worker log:\n%s", deadline, stored, n, q, qerr, logs)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if got := checkMirror(t, root, n); got != n {
		t.Fatalf("mirror has %d objects, want %d", got, n)
	}
	if q.dlq != 0 {
		t.Errorf("%d jobs dead-lettered, want 0", q.dlq)
	}
}

// workerProcess is a `mirrorworker run` child process.
type workerProcess struct {
	cmd    *exec.Cmd
	log    *logWatch
	exited chan struct{}
	err    error // valid after exited is closed
	start  startInfo
}

func startWorkerProcess(t *testing.T, args ...string) *workerProcess {
	t.Helper()
	return startWorkerProcessEnv(t, nil, args...)
}

// startWorkerProcessEnv is startWorkerProcess with extra KEY=value
// variables (a test hook such as faultEnv) in the child's environment
// only: t.Setenv would change the whole test binary's, which keeps a test
// from running in parallel.
func startWorkerProcessEnv(t *testing.T, extra []string, args ...string) *workerProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"run"}, args...)...)
	env := []string{asMainEnv + "=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MIRRORWORKER_") { // the test decides every flag
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, extra...)
	p := &workerProcess{cmd: cmd, log: newLogWatch(), exited: make(chan struct{})}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		// Copy the log until the process closes stderr, then reap it.
		r := bufio.NewReader(stderr)
		io.Copy(p.log, r)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("log of worker pid %d:\n%s", cmd.Process.Pid, p.log)
		}
	})
	p.start = p.log.waitStart(t, p.exited)
	return p
}

// signalAndWait sends sig and waits up to limit for the exit.
func (p *workerProcess) signalAndWait(t *testing.T, sig os.Signal, limit time.Duration) (time.Duration, error) {
	t.Helper()
	t0 := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		return time.Since(t0), p.err
	case <-time.After(limit):
		t.Fatalf("worker did not exit within %s of %s", limit, sig)
	}
	panic("unreachable")
}

// waitFor polls cond every 20 ms until it holds or fails after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// externalNATS is a JetStream server owned by the test, outliving workers.
func externalNATS(t *testing.T) string {
	t.Helper()
	e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return e.ClientURL()
}

func workerArgs(natsURL, dataDir string, extra ...string) []string {
	return append([]string{
		"--nats-url", natsURL,
		"--data-dir", dataDir,
		"--admin-addr", "127.0.0.1:0",
		"--allow-private-networks",
		"--floor", "0",
		"--log-level", "debug",
	}, extra...)
}

// TestProcessSIGTERMHandsBackInFlightJobs: SIGTERM while jobs are in flight
// (some finishing within the grace, some hung at the origin past it) exits 0
// within the grace; a second worker then stores every job exactly once,
// byte-exact, and the consumer is left with nothing pending or unacked.
func TestProcessSIGTERMHandsBackInFlightJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const n = 30
	natsURL := externalNATS(t)
	origin := newObjectOrigin(t)
	origin.delay.Store(int64(300 * time.Millisecond))
	hung := map[string]bool{"/obj/0": true, "/obj/1": true}
	origin.hang.Store(&hung)
	publishObjects(t, natsURL, origin, n)

	dataDir := t.TempDir()
	const grace = 1500 * time.Millisecond
	args := workerArgs(natsURL, dataDir, "--concurrency", "6", "--max-in-flight", "6", "--shutdown-grace", grace.String())
	a := startWorkerProcess(t, args...)
	root := a.start.Mirror
	if want := filepath.Join(dataDir, "mirror"); root != want {
		t.Errorf("start line mirror = %q, want the default %q", root, want)
	}

	waitFor(t, 20*time.Second, "hung requests and other requests in flight", func() bool {
		return origin.hungNow.Load() >= 1 && origin.inflight.Load()-origin.hungNow.Load() >= 1
	})
	took, err := a.signalAndWait(t, syscall.SIGTERM, grace+10*time.Second)
	if err != nil {
		t.Fatalf("worker exit after SIGTERM: %v, want status 0; log:\n%s", err, a.log)
	}
	t.Logf("first worker exited %s after SIGTERM (grace %s)", took.Round(time.Millisecond), grace)
	if took > grace+5*time.Second {
		t.Errorf("exit took %s, want about the grace %s", took, grace)
	}
	if !strings.Contains(a.log.String(), `"mirrorworker stopped"`) {
		t.Errorf("no stop line in the log")
	}
	first := checkMirror(t, root, n)
	if first >= n {
		t.Fatalf("all %d jobs stored before SIGTERM took effect; the test proves nothing", n)
	}
	if _, err := os.Stat(filepath.Join(root, objectKey(0))); err == nil {
		t.Errorf("%s stored although its download never finished", objectKey(0))
	}

	origin.release()
	b := startWorkerProcess(t, args...)
	waitDrained(t, natsURL, root, n, 30*time.Second, b.log)
	if _, err := b.signalAndWait(t, syscall.SIGTERM, grace+10*time.Second); err != nil {
		t.Fatalf("second worker exit after SIGTERM: %v", err)
	}
	checkMeta(t, root, origin, n)
	t.Logf("stored %d before SIGTERM, %d after; origin served %d complete 200s and %d 304s",
		first, n-first, origin.full200.Load(), origin.notModfied.Load())
}

// TestProcessSIGKILLThenRestart is issue 4's "Crash": killing the worker
// mid-run and starting it again ends with every job stored exactly once,
// byte-exact, and nothing partial outside .mirrorworker/.
func TestProcessSIGKILLThenRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const n = 40
	natsURL := externalNATS(t)
	origin := newObjectOrigin(t)
	origin.delay.Store(int64(100 * time.Millisecond))
	publishObjects(t, natsURL, origin, n)

	dataDir := t.TempDir()
	// A short AckWait so that the jobs the killed worker held come back soon.
	args := workerArgs(natsURL, dataDir, "--concurrency", "8", "--max-in-flight", "8", "--ack-wait", "2s")
	a := startWorkerProcess(t, args...)
	root := a.start.Mirror

	waitFor(t, 20*time.Second, "a quarter of the jobs stored and more in flight", func() bool {
		return len(mirrorFiles(t, root)) >= n/4 && origin.inflight.Load() >= 1
	})
	if _, err := a.signalAndWait(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("killed worker reported success")
	}
	first := checkMirror(t, root, n)
	if first >= n {
		t.Fatalf("all %d jobs stored before the kill; the test proves nothing", n)
	}

	b := startWorkerProcess(t, args...)
	waitDrained(t, natsURL, root, n, 40*time.Second, b.log)
	if _, err := b.signalAndWait(t, syscall.SIGTERM, 15*time.Second); err != nil {
		t.Fatalf("restarted worker exit after SIGTERM: %v", err)
	}
	checkMeta(t, root, origin, n)
	t.Logf("stored %d before the kill, %d after; origin served %d complete 200s and %d 304s",
		first, n-first, origin.full200.Load(), origin.notModfied.Load())
}

// connectJS connects to natsURL; the caller closes the connection.
func connectJS(t testing.TB, natsURL string) (jetstream.JetStream, func()) {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	return js, nc.Close
}
