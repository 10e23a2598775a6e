package loadtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/cluster"
	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// Timeouts of the pods' life cycle. They bound waits on other processes;
// none of them is part of what the report measures.
const (
	// podsBalanceTimeout bounds the wait for every pod to start, connect
	// and take its share of the partition leases.
	podsBalanceTimeout = 90 * time.Second
	// podShutdownGrace is each pod's --shutdown-grace; podStopTimeout is how
	// long after SIGTERM a pod is killed.
	podShutdownGrace = 2 * time.Second
	podStopTimeout   = 30 * time.Second
	// podLogTail is how many of a pod's last log lines an error quotes.
	podLogTail = 20
)

// pod is one `mirrorworker run` process of the load test.
type pod struct {
	id         string
	departures string // its departure log (departlog.Log)

	cmd    *exec.Cmd
	exited chan struct{}
	err    error // valid once exited is closed

	mu   sync.Mutex
	tail []string // last podLogTail log lines
}

// podArgs are the flags of one pod: the load test's JetStream, mirror and
// profile, nothing left to a default that a MIRRORWORKER_ variable could
// change.
func podArgs(o *Options, id, natsURL, dataDir, mirrorDir string) []string {
	p := o.Profile
	return []string{"run",
		"--nats-url", natsURL,
		"--data-dir", dataDir,
		"--target", mirrorDir,
		"--admin-addr", "127.0.0.1:0",
		"--allow-private-networks",
		"--floor", p.Floor.String(),
		"--max-in-flight", strconv.Itoa(p.MaxInFlight),
		"--time-scale", strconv.FormatFloat(p.Scale, 'g', -1, 64),
		"--concurrency", strconv.Itoa(o.Concurrency),
		"--worker-id", id,
		"--shutdown-grace", podShutdownGrace.String(),
		"--log-format", "json",
		"--log-level", o.PodLogLevel,
	}
}

// podEnv is this process's environment without MIRRORWORKER_ variables (the
// load test decides every flag of its pods), with the departure log's path.
func podEnv(departures string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MIRRORWORKER_") && !strings.HasPrefix(kv, departlog.Env+"=") {
			env = append(env, kv)
		}
	}
	return append(env, departlog.Env+"="+departures)
}

// startPod starts one pod. Its log goes to log (at the level each line
// carries) and its last lines are kept for errors.
func startPod(o *Options, id, natsURL, dir, mirrorDir string, log zerolog.Logger) (*pod, error) {
	dataDir := filepath.Join(dir, id)
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("pod %s: %w", id, err)
	}
	p := &pod{id: id, departures: filepath.Join(dir, id+".departures"), exited: make(chan struct{})}
	p.cmd = exec.Command(o.PodBinary, podArgs(o, id, natsURL, dataDir, mirrorDir)...)
	p.cmd.Env = podEnv(p.departures)
	p.cmd.Stdout = io.Discard
	p.cmd.SysProcAttr = podSysProcAttr()
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", id, err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start pod %s (%s): %w", id, o.PodBinary, err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.logLine(log, sc.Bytes())
		}
		io.Copy(io.Discard, stderr) // a line too long for the scanner
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// logLine passes one line of the pod's JSON log on at its own level.
func (p *pod) logLine(log zerolog.Logger, line []byte) {
	var e struct {
		Level   string `json:"level"`
		Message string `json:"message"`
	}
	lvl := zerolog.InfoLevel
	if json.Unmarshal(line, &e) == nil {
		if l, err := zerolog.ParseLevel(e.Level); err == nil && e.Level != "" {
			lvl = l
		}
	} else {
		e.Message = string(line)
	}
	if json.Valid(line) {
		log.WithLevel(lvl).Str("pod", p.id).RawJSON("entry", line).Msg(e.Message)
	} else {
		log.WithLevel(lvl).Str("pod", p.id).Msg(e.Message)
	}
	p.mu.Lock()
	p.tail = append(p.tail, string(line))
	if len(p.tail) > podLogTail {
		p.tail = p.tail[len(p.tail)-podLogTail:]
	}
	p.mu.Unlock()
}

// failure describes a pod that exited before it was asked to.
func (p *pod) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Errorf("pod %s exited: %v; its last log lines:\n%s", p.id, p.err, strings.Join(p.tail, "\n"))
}

// stop asks the pod to stop (SIGTERM: it hands its jobs back and gives up
// its leases) and kills it if it has not exited after podStopTimeout.
func (p *pod) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(podStopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// result is what the pod did: its requests (from its departure log, added
// to d) and, once it has exited, its CPU time and peak RSS.
func (p *pod) result(d *departures) (PodResult, error) {
	r := PodResult{ID: p.id}
	var err error
	r.Requests, err = d.readDepartureLog(p.id, p.departures)
	if ps := p.cmd.ProcessState; ps != nil {
		r.CPUSeconds = (ps.UserTime() + ps.SystemTime()).Seconds()
		r.MaxRSSBytes = maxRSS(ps)
		r.ExitCode = ps.ExitCode()
	}
	return r, err
}

// startPods starts o.Workers pods and waits until the partition leases are
// spread over them and stop moving, so that the run measures the cluster
// serving, not one pod serving alone until the others have joined, nor
// hand-overs of the start-up. On error every pod started is stopped.
func startPods(ctx context.Context, o *Options, js jetstream.JetStream, name, natsURL, dir, mirrorDir string, partitions int) ([]*pod, error) {
	var pods []*pod
	stopAll := func() {
		var wg sync.WaitGroup
		for _, p := range pods {
			wg.Go(p.stop)
		}
		wg.Wait()
	}
	for i := range o.Workers {
		id := fmt.Sprintf("loadtest-%s-pod%d", name, i+1)
		p, err := startPod(o, id, natsURL, dir, mirrorDir, o.Logger)
		if err != nil {
			stopAll()
			return nil, err
		}
		pods = append(pods, p)
	}
	leases, err := js.KeyValue(ctx, jobs.LeasesBucket)
	if err != nil {
		stopAll()
		return nil, fmt.Errorf("bucket %s: %w", jobs.LeasesBucket, err)
	}
	deadline := time.Now().Add(podsBalanceTimeout)
	// Every pod aims at ⌈P/W⌉ partitions and gives back what is over it,
	// so the leases stop moving once every partition is held and each pod
	// holds ⌊P/W⌋ or ⌈P/W⌉ of them: a hand-over after that would happen
	// inside the measured run.
	low, high := partitions/o.Workers, (partitions+o.Workers-1)/o.Workers
	var held map[string]int
	for {
		for _, p := range pods {
			select {
			case <-p.exited:
				err := p.failure()
				stopAll()
				return nil, err
			default:
			}
		}
		held = leaseHolders(ctx, js, leases)
		balanced, total := len(held) == o.Workers, 0
		for _, n := range held {
			balanced = balanced && n >= low && n <= high
			total += n
		}
		balanced = balanced && total == partitions
		if balanced {
			return pods, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stopAll()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("the %d pods did not share the %d partitions within %s (leases held: %v)", o.Workers, partitions, podsBalanceTimeout, held)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// leaseHolders counts the partition leases each pod holds.
func leaseHolders(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) map[string]int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	held := map[string]int{}
	leases, _ := jobs.Entries[cluster.Lease](ctx, js, kv) // none on an error: no holder seen
	for _, l := range leases {
		if l.Pod != "" {
			held[l.Pod]++
		}
	}
	return held
}

// partitionedQueue reads the partitioned layout's queue (docs/adr/0007): a
// job waits in its partition consumer on MIRROR_JOBS (pending or delivered
// and unacked), in a lane or catch-up consumer, or in MIRROR_PARKED.
// Deliveries are summed over those consumers (a lane's are gone with it
// once it is deleted).
func partitionedQueue(js jetstream.JetStream) func(context.Context) (queueSnap, error) {
	return func(ctx context.Context) (queueSnap, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var s queueSnap
		js0, err := js.Stream(ctx, jobs.JobsStream)
		if err != nil {
			return s, fmt.Errorf("stream %s: %w", jobs.JobsStream, err)
		}
		var infos []*jetstream.ConsumerInfo
		cl := js0.ListConsumers(ctx)
		for ci := range cl.Info() {
			if jobs.HoldsJobs(ci.Name) {
				infos = append(infos, ci)
			}
		}
		if err := cl.Err(); err != nil {
			return s, fmt.Errorf("consumers of %s: %w", jobs.JobsStream, err)
		}
		if err := s.sumConsumers(ctx, js0, infos); err != nil {
			return s, err
		}
		ps, err := js.Stream(ctx, jobs.ParkStream)
		if err != nil {
			return s, fmt.Errorf("stream %s: %w", jobs.ParkStream, err)
		}
		pi, err := ps.Info(ctx)
		if err != nil {
			return s, fmt.Errorf("stream %s info: %w", jobs.ParkStream, err)
		}
		s.pending += pi.State.Msgs
		if err := readDead(ctx, js, &s); err != nil {
			return s, err
		}
		return s, nil
	}
}

var errNoBinary = errors.New("no mirrorworker executable for the pods: set Options.PodBinary or use InProcess")
