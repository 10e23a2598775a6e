package main

// BenchmarkThroughput's process mode (MW_BENCH_PROCS=1): each side of each
// round is a process of its own on a nats-server process of its own, with
// a fresh store and mirror that are deleted when the round ends, as issue
// 40's rounds were measured. The in-process mode shares one process, its
// heap and its scheduler across every round and both sides; this one
// leaves only the file system and the origins shared between rounds.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/internal/testbin"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// benchProcsEnv selects the process mode of BenchmarkThroughput.
const benchProcsEnv = "MW_BENCH_PROCS"

// benchRawEnv makes the test binary run the raw pipeline as a process of
// its own: "natsURL,dir,goroutines". It stops when stdin closes.
const benchRawEnv = "MW_BENCH_RAW"

// rawChildMain is the raw pipeline of the process mode: no project code,
// the same loop as runRawPipeline's, on the consumer "raw" of the stream
// RAW at natsURL.
func rawChildMain(spec string) error {
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		return fmt.Errorf("%s=%q: want natsURL,dir,goroutines", benchRawEnv, spec)
	}
	g, err := strconv.Atoi(f[2])
	if err != nil {
		return err
	}
	nc, err := nats.Connect(f[0])
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(context.Background(), "RAW", "raw")
	if err != nil {
		return err
	}
	hc := rawHTTPClient(g)
	store, err := rawFileStore(f[1], hc)
	if err != nil {
		return err
	}
	stop, err := rawConsume(cons, g, store, func(err error) { fmt.Fprintln(os.Stderr, "raw:", err) })
	if err != nil {
		return err
	}
	io.Copy(io.Discard, os.Stdin)
	stop()
	return nil
}

// benchProc is a child process of the process mode.
type benchProc struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
}

func startBenchProc(b testing.TB, cmd *exec.Cmd) *benchProc {
	b.Helper()
	p := &benchProc{cmd: cmd, out: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if cmd.Stdin == nil {
		cmd.Stdin = strings.NewReader("") // no pipe unless the caller set one
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.exited) }()
	return p
}

// stop sends SIGTERM and waits for the exit.
func (p *benchProc) stop(b testing.TB) {
	b.Helper()
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.cmd.Process.Kill()
		<-p.exited
		b.Errorf("%s did not stop on SIGTERM; output:\n%s", p.cmd.Path, p.out)
	}
}

// kernelThreadsCPU is the CPU time all kernel threads (kworkers, flushers:
// write-back a syncfs hands them, which no process is charged for) have
// used so far (procStat's flags has PF_KTHREAD).
func kernelThreadsCPU() time.Duration {
	dirs, _ := os.ReadDir("/proc")
	var all time.Duration
	for _, d := range dirs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		if flags, user, sys, ok := procStat("/proc/" + d.Name() + "/stat"); ok && flags&0x00200000 != 0 {
			all += user + sys
		}
	}
	return all
}

// procStat reads a /proc/<pid>/stat file: the process's flags, and its user
// and system time so far (clock ticks of 10 ms).
func procStat(path string) (flags uint64, user, sys time.Duration, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, 0, false
	}
	// Fields after the command's name, which is in parentheses: the 7th
	// is flags, the 12th and 13th utime and stime.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, 0, 0, false
	}
	flags, _ = strconv.ParseUint(f[6], 10, 64)
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return flags, time.Duration(ut) * 10 * time.Millisecond, time.Duration(st) * 10 * time.Millisecond, true
}

// cpu is the process's user and system time so far (from /proc, in clock
// ticks of 10 ms).
func (p *benchProc) cpu() time.Duration {
	u, s := p.cpuSplit()
	return u + s
}

// cpuSplit is the process's user and system time so far.
func (p *benchProc) cpuSplit() (user, sys time.Duration) {
	_, user, sys, _ = procStat(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	return user, sys
}

// startBenchNATS starts a fresh nats-server process with JetStream storing
// under dir, listening on a free loopback port, with its monitoring
// endpoint (/varz) at mon and its profiling one (/debug/pprof) at prof.
func startBenchNATS(b testing.TB, dir string) (p *benchProc, url, mon, prof string) {
	b.Helper()
	ports := testbin.FreePorts(b, 3)
	port := ports[0]
	mon = fmt.Sprintf("127.0.0.1:%d", ports[1])
	prof = fmt.Sprintf("127.0.0.1:%d", ports[2])
	conf := filepath.Join(dir, "nats.conf")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	text := fmt.Sprintf("listen: 127.0.0.1:%d\nhttp: %q\nprof_port: %d\nmax_payload: 8MB\njetstream { store_dir: %q, max_memory_store: 256MB }\n", port, mon, ports[2], filepath.Join(dir, "js"))
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
	p = startBenchProc(b, exec.Command(testbin.Binary(b, natsServer), "-c", conf))
	url = fmt.Sprintf("nats://127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		js, closeConn, err := tryConnectJS(url)
		if err == nil {
			_, err = js.AccountInfo(context.Background())
			closeConn()
			if err == nil {
				return p, url, mon, prof
			}
		}
		select {
		case <-p.exited:
			b.Fatalf("nats-server exited:\n%s", p.out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop(b)
			b.Fatalf("nats-server not answering after 30s:\n%s", p.out)
		}
	}
}

// runProcRound runs one side of one round of the process mode: a fresh
// nats-server process and directory, the backlog published to it, then
// the pipeline's process until every job is acked. CPU is the pipeline's
// and its nats-server's. The directory is deleted when the round ends.
func runProcRound(b *testing.B, bl benchBacklog, raw bool, g int, args []string) pipelineResult {
	b.Helper()
	ctx := context.Background()
	dir, err := os.MkdirTemp(b.TempDir(), "round-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir) // the next round meets the file system after these deletions
	ns, url, mon, prof := startBenchNATS(b, filepath.Join(dir, "nats"))
	defer ns.stop(b)
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	stream := jobs.JobsStream
	if raw {
		stream = "RAW"
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage}); err != nil {
			b.Fatal(err)
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, "RAW", jetstream.ConsumerConfig{
			Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxAckPending: 20000,
		}); err != nil {
			b.Fatal(err)
		}
		publishRawBacklog(b, js, bl)
	} else {
		// MW_BENCH_PARTITIONS: the stream's partitions (and the
		// worker's --partitions), to weigh what each partition's
		// consumer costs its nats-server.
		var so *jobs.StreamOptions
		if n, err := strconv.Atoi(os.Getenv("MW_BENCH_PARTITIONS")); err == nil && n > 0 {
			so = &jobs.StreamOptions{Partitions: n}
			args = append([]string{"--partitions", strconv.Itoa(n)}, args...)
		}
		if err := jobs.EnsureStreams(ctx, js, so); err != nil {
			b.Fatal(err)
		}
		publishJobs(b, js, bl.total(), bl.job)
	}

	var pipe atomic.Pointer[benchProc]
	bl.origin.reset(b, bl.warm)
	watch := newAckWatch(bl.warm, bl.measured, nil)
	watch.cpuNow = func() time.Duration {
		if p := pipe.Load(); p != nil {
			return p.cpu() + ns.cpu()
		}
		return 0
	}
	// The server's CPU and counts at the first ack split its start-up
	// (streams, consumers, buckets, leases) from the jobs' share.
	var nsFirst atomic.Int64
	var varzFirst atomic.Pointer[natsVarz]
	watch.onFirst = func() {
		// Read here, on the ack watch's callback: it delays the next
		// acks' timestamps by a loopback GET, once, and needs no
		// goroutine that could outlive the server.
		nsFirst.Store(int64(ns.cpu()))
		if v, err := readVarz(mon); err == nil { // else no split is logged
			varzFirst.Store(&v)
		}
	}
	watch.subscribe(b, nc, stream)
	var tap *subjectTap
	if os.Getenv(benchSubjectsEnv) != "" {
		tap = startSubjectTap(b, nc)
	}
	varz0 := mustVarz(b, mon)

	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	var cmd *exec.Cmd
	if raw {
		cmd = exec.Command(exe)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%d", benchRawEnv, url, dir, g))
	} else {
		full := append([]string{"run", "--nats-url", url, "--data-dir", filepath.Join(dir, "worker"),
			"--admin-addr", "127.0.0.1:0", "--floor", "0", "--allow-private-networks"}, args...)
		cmd = exec.Command(exe, full...)
		cmd.Env = []string{asMainEnv + "=1"}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "MIRRORWORKER_") && !strings.HasPrefix(kv, "MW_BENCH_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	kthreads0 := kernelThreadsCPU()
	p := startBenchProc(b, cmd)
	pipe.Store(p)
	if pdir := os.Getenv(benchNATSProfileEnv); pdir != "" {
		secs := 5
		if v, err := strconv.Atoi(os.Getenv(benchNATSProfileEnv + "_SECONDS")); err == nil && v > 0 {
			secs = v
		}
		side := "worker"
		if raw {
			side = "raw"
		}
		defer natsProfile(b, prof, filepath.Join(pdir, fmt.Sprintf("%s-nats%d.pprof", side, ns.cmd.Process.Pid)), secs)()
	}
	defer func() {
		stdin.Close()
		p.stop(b)
		if b.Failed() {
			b.Logf("output of the pipeline:\n%s", p.out)
		}
	}()
	elapsed, deliveries, naks := watch.wait(b, 10*time.Minute)
	side := "worker"
	if raw {
		side = "raw"
	}
	{
		// What the server carried (the benchmark's own ack watch and
		// tap included: they receive, never send).
		end := mustVarz(b, mon)
		v := end.sub(varz0)
		per := func(n int64) float64 { return float64(n) / float64(bl.total()) }
		b.Logf("  %s: nats-server in %.2f msgs %.0f B, out %.2f msgs %.0f B per job (whole run, /varz)",
			side, per(v.InMsgs), per(v.InBytes), per(v.OutMsgs), per(v.OutBytes))
		if f := varzFirst.Load(); f != nil {
			s, j := f.sub(varz0), end.sub(*f)
			first := time.Duration(nsFirst.Load())
			b.Logf("  %s: nats-server before the first ack: %d msgs in, %d out, CPU %v; from it to the last: in %.2f msgs, out %.2f msgs, CPU %.0f µs per job (/varz, /proc)",
				side, s.InMsgs, s.OutMsgs, first.Round(time.Millisecond), per(j.InMsgs), per(j.OutMsgs), float64((ns.cpu()-first).Microseconds())/float64(bl.total()))
		}
		if tap != nil {
			logSubjectCounts(b, side, tap.stop(), bl.total())
		}
	}
	{
		// Where the CPU went, over the whole run (warm-up included).
		pu, ps := p.cpuSplit()
		nu, nsys := ns.cpuSplit()
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(bl.total()) }
		b.Logf("  %s: pipeline user %.0f sys %.0f, nats-server user %.0f sys %.0f µs/job (whole run); the kernel's threads (write-back, machine-wide, anyone's) %.0f µs/job",
			side, per(pu), per(ps), per(nu), per(nsys), per(kernelThreadsCPU()-kthreads0))
	}
	if raw && naks > 0 {
		b.Fatalf("raw pipeline: %d NAKs; output:\n%s", naks, p.out)
	}
	res := pipelineResult{measured: bl.measured, elapsed: elapsed, origin: bl.origin.stats(b), deliveries: deliveries, naks: naks, cpu: watch.cpu(),
		whole: watch.whole(), early: watch.earlyAcks(), curve: watch.curve()}
	if !raw {
		if s, err := js.Stream(ctx, jobs.ParkStream); err == nil {
			if info, err := s.Info(ctx); err == nil {
				res.parked = info.State.LastSeq
			}
		}
	}
	return res
}

// publishRawBacklog publishes bl's jobs to the raw pipelines' stream.
func publishRawBacklog(b testing.TB, js jetstream.JetStream, bl benchBacklog) {
	b.Helper()
	for i := range bl.total() {
		u, t := bl.job(i)
		data, _ := json.Marshal(rawJob{URL: u, Target: t})
		// A loaded machine's server may be slower than the default
		// stall wait (200 ms) to make room.
		if _, err := js.PublishAsync("raw.jobs."+strconv.Itoa(i%bl.authorities), data, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("raw publish acks did not arrive")
	}
}
