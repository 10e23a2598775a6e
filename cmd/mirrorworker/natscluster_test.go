package main

// A real 3-node JetStream cluster: three nats-server processes on loopback,
// built from the nats-server module this project already depends on. It
// tests --stream-replicas end to end and what a lost server costs.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/internal/testbin"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// natsServer is the nats-server command of the version in go.mod, built
// from the module cache (no download beyond the module itself).
var natsServer = testbin.Program{Name: "nats-server", Package: "github.com/nats-io/nats-server/v2", Module: "github.com/nats-io/nats-server/v2"}

// natsNode is one nats-server process of a test cluster.
type natsNode struct {
	name   string
	url    string
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
}

// natsCluster starts three clustered JetStream servers and waits until
// JetStream answers (a meta leader is elected).
func natsCluster(t *testing.T) []*natsNode {
	t.Helper()
	bin := testbin.Binary(t, natsServer)
	ports := testbin.FreePorts(t, 6)
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3+i]))
	}
	dir := t.TempDir()
	var nodes []*natsNode
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream { store_dir: %q, max_file_store: 1GB, max_memory_store: 64MB }
cluster {
  name: mwtest
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, name, ports[i], filepath.Join(dir, name), ports[3+i], strings.Join(routes, ", "))
		cf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		n := &natsNode{name: name, url: fmt.Sprintf("nats://127.0.0.1:%d", ports[i]), out: &syncBuffer{}, exited: make(chan struct{})}
		n.cmd = exec.Command(bin, "-c", cf)
		n.cmd.Stdout, n.cmd.Stderr = n.out, n.out
		if err := n.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { n.cmd.Wait(); close(n.exited) }()
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			select {
			case <-n.exited:
			default:
				n.cmd.Process.Kill()
				<-n.exited
			}
			if t.Failed() {
				t.Logf("log of %s:\n%s", n.name, n.out)
			}
		}
	})
	var nc *nats.Conn
	waitFor(t, 30*time.Second, "the servers accepting connections", func() bool {
		c, err := nats.Connect(clusterURL(nodes))
		nc = c
		return err == nil
	})
	defer nc.Close()
	js, _ := jetstream.New(nc)
	waitFor(t, 60*time.Second, "JetStream cluster ready", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
	return nodes
}

func clusterURL(nodes []*natsNode) string {
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.url)
	}
	return strings.Join(urls, ",")
}

// syncBuffer is a buffer safe for concurrent writes (a child's output, a
// logger's); its zero value is ready. One value serves as both Stdout and
// Stderr, so that exec copies both through one goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// streamReplicas returns the replicas (leader and followers) of a stream.
func streamReplicas(t *testing.T, js jetstream.JetStream, name string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	si := s.CachedInfo()
	if si.Cluster == nil {
		return si.Config.Replicas, ""
	}
	return si.Config.Replicas, si.Cluster.Leader
}

// TestClusterStreamLeaderKilled: on a 3-node cluster, enqueue and two
// workers with --stream-replicas 3 make every stream, the bucket and the
// consumer R3; killing the jobs stream leader's server mid-run (it never
// comes back) loses no job, costs at most 1.1 origin requests per job, and
// both workers stay up and become ready again.
func TestClusterStreamLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node nats-server cluster and worker processes")
	}
	t.Parallel()
	const n = 300
	nodes := natsCluster(t)
	url := clusterURL(nodes)

	origin := newObjectOrigin(t)
	origin.delay.Store(int64(150 * time.Millisecond))
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, `{"url":%q,"target":%q}`+"\n", fmt.Sprintf("%s/obj/%d", origin.URL, i), objectKey(i))
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)

	// Before any worker: enqueue without --stream-replicas creates R1
	// streams and says so; with it, raises them to 3.
	all := strings.SplitAfter(lines.String(), "\n")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"enqueue", "--nats-url", url}, noEnv,
		strings.NewReader(strings.Join(all[:10], "")), &out, &errOut); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(errOut.String(), "--stream-replicas 3") {
		t.Errorf("enqueue left R1 streams on a cluster without a word: stderr %q", errOut.String())
	}
	if r, _ := streamReplicas(t, js, jobs.JobsStream); r != 1 {
		t.Fatalf("enqueue without --stream-replicas made %d replicas, want 1", r)
	}
	errOut.Reset()
	if err := run(context.Background(), []string{"enqueue", "--nats-url", url, "--stream-replicas", "3"}, noEnv,
		strings.NewReader(strings.Join(all[10:], "")), &out, &errOut); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errOut.String())
	}
	if strings.Contains(errOut.String(), "replica") {
		t.Errorf("enqueue with --stream-replicas 3 warned about replicas: %s", errOut.String())
	}
	for _, s := range []string{jobs.JobsStream, jobs.DLQStream, jobs.EventsStream, "KV_" + jobs.AttemptsBucket} {
		if r, _ := streamReplicas(t, js, s); r != 3 {
			t.Errorf("enqueue --stream-replicas 3 left %s with %d replicas, want 3", s, r)
		}
	}

	dataDir := t.TempDir() // one mirror, shared as a ReadWriteMany volume would be
	var workers []*workerProcess
	for i := range 2 {
		workers = append(workers, startWorkerProcess(t, workerArgs(url, dataDir,
			"--stream-replicas", "3", "--worker-id", fmt.Sprintf("w%d", i),
			"--concurrency", "4", "--max-in-flight", "8")...))
	}
	root := workers[0].start.Mirror

	// The workers' own assets (the partitioned layout, ADR 0007) are
	// replicated too: the work queue, the parking lot, the two buckets and
	// every partition consumer.
	for _, s := range []string{jobs.ParkStream, "KV_" + jobs.LeasesBucket, "KV_" + jobs.PodsBucket} {
		if r, _ := streamReplicas(t, js, s); r != 3 {
			t.Errorf("%s has %d replicas, want 3", s, r)
		}
	}
	// The partition consumer of the origin's authority (all jobs are its).
	part := jobs.PartitionConsumer(jobs.Partition(authority.KeyOf(strings.TrimPrefix(origin.URL, "http://")), jobs.DefaultPartitions))
	var ci *jetstream.ConsumerInfo
	waitFor(t, 30*time.Second, "the partition consumer "+part+" with a leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := js.Consumer(ctx, jobs.JobsStream, part)
		if err != nil {
			return false
		}
		ci = c.CachedInfo()
		return ci.Cluster != nil && ci.Cluster.Leader != ""
	})
	if len(ci.Cluster.Replicas)+1 != 3 {
		t.Errorf("consumer cluster info %+v, want a leader and 2 replicas", ci.Cluster)
	}

	// The hardest case: the killed server leads the work stream and the
	// consumer, so acks and deliveries move with the stream. Ask the
	// consumer's leader to step down in favour of the stream leader's server.
	consLeader := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if c, err := js.Consumer(ctx, jobs.JobsStream, part); err == nil && c.CachedInfo().Cluster != nil {
			return c.CachedInfo().Cluster.Leader
		}
		return ""
	}
	_, leader := streamReplicas(t, js, jobs.JobsStream)
	if consLeader() != leader {
		req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, leader)
		if _, err := nc.Request("$JS.API.CONSUMER.LEADER.STEPDOWN."+jobs.JobsStream+"."+part, []byte(req), 5*time.Second); err != nil {
			t.Fatalf("consumer leader stepdown: %v", err)
		}
		waitFor(t, 20*time.Second, "the consumer led by "+leader, func() bool { return consLeader() == leader })
	}

	waitFor(t, 60*time.Second, "a quarter of the jobs stored", func() bool {
		return len(mirrorFiles(t, root)) >= n/4
	})
	_, leader = streamReplicas(t, js, jobs.JobsStream)
	cl := consLeader()
	var victim *natsNode
	for _, nd := range nodes {
		if nd.name == leader {
			victim = nd
		}
	}
	if victim == nil {
		t.Fatalf("stream leader %q is none of the nodes", leader)
	}
	before := len(mirrorFiles(t, root))
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.exited
	t.Logf("killed %s, the %s leader (consumer leader %s), with %d/%d stored after %d origin requests",
		victim.name, jobs.JobsStream, cl, before, n, origin.requests.Load())

	if before >= n {
		t.Fatal("every job was stored before the kill; the test proves nothing")
	}

	waitDrained(t, url, root, n, 120*time.Second, workers[0].log)
	_, newLeader := streamReplicas(t, js, jobs.JobsStream)
	for i, w := range workers {
		select {
		case <-w.exited:
			t.Errorf("worker %d exited: %v", i, w.err)
		default:
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("worker %d ready", i), func() bool {
			resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(w.start.AdminURL + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	checkMeta(t, root, origin, n)
	reqs := origin.requests.Load()
	ratio := float64(reqs) / n
	t.Logf("new %s leader %s; origin requests %d for %d jobs (%.3f per job): %d complete 200s, %d 304s",
		jobs.JobsStream, newLeader, reqs, n, ratio, origin.full200.Load(), origin.notModfied.Load())
	if ratio > 1.1 {
		t.Errorf("%.3f origin requests per job, want at most 1.1", ratio)
	}

	// Commands that do not say --stream-replicas leave replicated streams
	// replicated: enqueue, and a worker started without the flag.
	errOut.Reset()
	if err := run(context.Background(), []string{"enqueue", "--nats-url", url}, noEnv, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errOut.String())
	}
	if strings.Contains(errOut.String(), "replica") {
		t.Errorf("enqueue warned about R3 streams: %s", errOut.String())
	}
	workers = append(workers, startWorkerProcess(t, workerArgs(url, dataDir, "--worker-id", "w-noflag")...))
	for _, s := range []string{jobs.JobsStream, jobs.DLQStream, jobs.EventsStream, "KV_" + jobs.AttemptsBucket, jobs.ParkStream, "KV_" + jobs.LeasesBucket} {
		if r, _ := streamReplicas(t, js, s); r != 3 {
			t.Errorf("after a worker without --stream-replicas, %s has %d replicas, want 3", s, r)
		}
	}
	for _, w := range workers {
		if _, err := w.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("worker exit after SIGTERM: %v", err)
		}
	}
}
