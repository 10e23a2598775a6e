package main

// A NATS server killed and restarted under three pods, and a rolling
// restart of the pods (issue 25), each struck right after the RateLimit
// authority told its pod to wait. They reuse the origin, the departure
// logs and the checks of netfault_process_test.go.

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/internal/testbin"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// faultRig is an origin with five authorities (one answering every fifth
// request with an exhausted RateLimit, reset 8 s), its jobs on NATS, and
// the pods serving them, each logging its departures.
type faultRig struct {
	natsURL    string
	origin     *clusterOrigin
	rl         string // the RateLimit authority
	targets    map[string]string
	urls       []string
	root       string // the shared mirror
	pods       []*workerProcess
	departures []string
	t0         time.Time
}

const (
	rigFloor = 300 * time.Millisecond
	rigTTL   = 2 * time.Second
	// rigPerAuth jobs an authority: the RateLimit authority's 5th answer
	// says wait, the fault strikes in that wait, and 3 jobs are left for
	// after it; the 429 and 503 authorities have one cooldown each (the
	// 6th request) and its probe. 10 left 2 jobs more each after the
	// waits, at the slower pace a wait leaves behind, which no check
	// needs: 7 s of the NATS restart's drain.
	rigPerAuth = 8
)

func newFaultRig(t *testing.T, natsURL string, perAuth int) *faultRig {
	r := &faultRig{natsURL: natsURL, root: t.TempDir(), t0: time.Now()}
	r.origin = newClusterOrigin(t, jobs.DefaultPartitions, "plain", "cdn", "429", "503date", "ratelimit")
	r.rl = r.origin.named("ratelimit")
	r.origin.mu.Lock()
	r.origin.auths[r.rl].every, r.origin.auths[r.rl].wait = 5, 8*time.Second
	r.origin.mu.Unlock()
	r.targets, r.urls = r.origin.urls(perAuth)
	publishURLs(t, natsURL, r.targets, r.urls)
	return r
}

// startPod starts one more pod.
func (r *faultRig) startPod(t *testing.T) *workerProcess {
	dep := filepath.Join(t.TempDir(), fmt.Sprintf("departures-%d", len(r.departures)))
	r.departures = append(r.departures, dep)
	t.Setenv(departlog.Env, dep)
	p := startWorkerProcessEnv(t, podsShareMirror, workerArgs(r.natsURL, t.TempDir(),
		"--target", r.root, "--floor", rigFloor.String(), "--concurrency", "8", "--max-in-flight", "2",
		"--lease-ttl", rigTTL.String(), "--ack-wait", "10s", "--log-level", "info")...)
	r.pods = append(r.pods, p)
	return p
}

// waitWaitAnswer waits until the RateLimit authority has just said wait.
func (r *faultRig) waitWaitAnswer(t *testing.T) {
	waitFor(t, 60*time.Second, "a wait-answer of the RateLimit authority", func() bool {
		r.origin.mu.Lock()
		defer r.origin.mu.Unlock()
		return time.Now().Before(r.origin.auths[r.rl].until)
	})
	if n := len(mirrorFiles(t, r.root)); n >= len(r.urls) {
		t.Fatalf("all %d jobs stored before the fault; the test proves nothing", n)
	}
}

// finish waits for the drain, stops the pods that still run, and checks
// as the origin saw it: every job stored byte-exact, no gap below the
// floor, no request while told to wait.
func (r *faultRig) finish(t *testing.T, what string) {
	waitQueueEmpty(t, r.natsURL, r.root, len(r.urls), 120*time.Second, multiLog(r.pods))
	drain := time.Since(r.t0)
	for i, p := range r.pods {
		select {
		case <-p.exited:
			continue
		default:
		}
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("pod %d exit after SIGTERM: %v", i, err)
		}
	}
	checkClusterMirror(t, r.root, r.targets)
	early := netFaultCheck(t, r.origin, rigFloor, readDepartures(t, r.departures))
	if early > 0 {
		t.Errorf("%s: %d requests while the origin had said wait", what, early)
	}
	t.Logf("%s: drained %d jobs in %s, %d requests while told to wait", what, len(r.urls), drain.Round(10*time.Millisecond), early)
}

// natsProcess is a standalone nats-server with JetStream on a file store,
// which a test can kill -9 and start again on the same port and store.
type natsProcess struct {
	bin, conf, url string
	cmd            *exec.Cmd
	out            *syncBuffer
	exited         chan struct{}
}

func startNATSProcess(t *testing.T) *natsProcess {
	t.Helper()
	dir := t.TempDir()
	n := &natsProcess{bin: testbin.Binary(t, natsServer), conf: filepath.Join(dir, "nats.conf"), out: &syncBuffer{}}
	port := testbin.FreePorts(t, 1)[0]
	n.url = fmt.Sprintf("nats://127.0.0.1:%d", port)
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q, max_file_store: 1GB, max_memory_store: 64MB }\n", port, filepath.Join(dir, "js"))
	if err := os.WriteFile(n.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start(t)
	t.Cleanup(func() {
		n.kill(t)
		if t.Failed() {
			t.Logf("log of nats-server:\n%s", n.out)
		}
	})
	return n
}

func (n *natsProcess) start(t *testing.T) {
	t.Helper()
	n.cmd = exec.Command(n.bin, "-c", n.conf)
	n.cmd.Stdout, n.cmd.Stderr = n.out, n.out
	n.exited = make(chan struct{})
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(n.cmd, n.exited)
	waitFor(t, 30*time.Second, "nats-server answering JetStream", func() bool {
		js, closeConn, err := tryConnectJS(n.url)
		if err != nil {
			return false
		}
		defer closeConn()
		_, err = js.AccountInfo(t.Context())
		return err == nil
	})
}

// kill sends SIGKILL and waits for the exit.
func (n *natsProcess) kill(t *testing.T) {
	t.Helper()
	select {
	case <-n.exited:
		return
	default:
	}
	if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-n.exited
}

// TestProcessClusterNATSRestart: the standalone nats-server of three pods
// is killed (-9) right after the RateLimit authority told its pod to wait,
// and started again on the same store three seconds later (longer than the
// lease TTL: every lease expires and is taken anew). Every job is stored
// byte-exact, no two requests to an authority come closer than the floor,
// and none arrives while the origin had said wait: the wait's fact, not
// stored when the server died, is published once the pod is back, before
// whichever pod takes the partition over sends (docs/adr/0007).
func TestProcessClusterNATSRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and worker processes")
	}
	srv := startNATSProcess(t)
	r := newFaultRig(t, srv.url, rigPerAuth)
	for range 3 {
		r.startPod(t)
	}
	r.waitWaitAnswer(t)
	srv.kill(t)
	struck := time.Now()
	t.Logf("nats-server killed at %.3fs on the origin's clock, %d/%d stored", struck.Sub(r.origin.start).Seconds(), len(mirrorFiles(t, r.root)), len(r.urls))
	// The fault itself: the server stays down for 1.5 TTLs.
	time.Sleep(rigTTL * 3 / 2)
	srv.start(t)
	t.Logf("nats-server back %s after the kill", time.Since(struck).Round(10*time.Millisecond))
	r.finish(t, "NATS kill -9 and restart")
}

// TestProcessClusterRollingRestart: right after the RateLimit authority
// told its pod to wait, the three pods are replaced one at a time, as a
// Kubernetes rollout does, the wait's pod first: a new pod starts, and
// the next old one gets SIGTERM only once the new one is ready (/readyz:
// it holds its share). Every job is stored byte-exact, no gap below the
// floor, and no request while the origin had said wait: a pod giving a
// partition back stores its facts before the lease goes, and the pod
// taking it applies them before its first request.
func TestProcessClusterRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	natsURL := externalNATS(t)
	r := newFaultRig(t, natsURL, rigPerAuth)
	for range 3 {
		r.startPod(t)
	}
	old := append([]*workerProcess(nil), r.pods...)
	r.waitWaitAnswer(t)
	owner := netFaultOwner(t, natsURL, r.rl, jobs.DefaultPartitions, old)
	first := -1
	waitFor(t, 30*time.Second, "a pod holding the lease of "+r.rl, func() bool { first = owner(); return first >= 0 })
	old[0], old[first] = old[first], old[0]
	for i, p := range old {
		np := r.startPod(t)
		waitFor(t, 60*time.Second, fmt.Sprintf("replacement %d ready", i), func() bool { return podReady(np) })
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("old pod %d exit after SIGTERM: %v", i, err)
		}
		t.Logf("pod %d replaced at %.3fs on the origin's clock, %d/%d stored", i, time.Since(r.origin.start).Seconds(), len(mirrorFiles(t, r.root)), len(r.urls))
	}
	r.finish(t, "rolling restart")
}

// podReady reports whether p's /readyz answers 200.
func podReady(p *workerProcess) bool {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(p.start.AdminURL + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// tryConnectJS is connectJS for a server that may not answer yet.
func tryConnectJS(natsURL string) (jetstream.JetStream, func(), error) {
	nc, err := nats.Connect(natsURL, nats.Timeout(time.Second))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}
