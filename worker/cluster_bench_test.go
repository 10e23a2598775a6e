package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/cluster"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// cpuSeconds is the process's user+system CPU time (the embedded NATS
// server included: it runs in this process).
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// rssMiB is the process's resident set size.
func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkParking measures what parking a cooling origin's backlog costs
// and whether healthy jobs behind it keep their speed: MW_BENCH_PARKED jobs
// (default 10,000; the closing note's 1,000,000 is MW_BENCH_PARKED=1000000)
// for an origin that answers 429 with Retry-After 600, then 1,000 healthy
// jobs over 10 origins, one of which shares the cooling origin's partition,
// against the same 1,000 alone measured just before.
//
//	MW_BENCH_PARKED=1000000 go test -run '^$' -bench Parking -benchtime 1x -timeout 60m ./worker/
//
// MW_BENCH_LANES=0 turns lanes off (parking job by job only), for comparison.
func BenchmarkParking(b *testing.B) {
	backlogN := envInt("MW_BENCH_PARKED", 10_000)
	for range b.N {
		e := newEnv(b, 30*time.Second)
		slow := newOrigin(b)
		slow.setBehave(func(w http.ResponseWriter, _ *http.Request, _ int) bool {
			w.Header().Set("Retry-After", "600")
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		})
		// One healthy authority shares the cooling one's partition: the
		// hard case, where the backlog is ahead of it in one consumer.
		healthy := []*origin{originInPartition(b, jobs.Partition(authority.KeyOf(slow.auth), jobs.DefaultPartitions))}
		for range 9 {
			healthy = append(healthy, newOrigin(b))
		}
		round := func(name string) []jobs.Job {
			var js []jobs.Job
			for i := range 1000 {
				o := healthy[i%len(healthy)]
				js = append(js, jobs.Job{ID: fmt.Sprint(name, "-", i), URL: o.url(fmt.Sprint("/", name, "/", i)), Target: fmt.Sprint(name, "/", i)})
			}
			return js
		}
		o := worker.Options{}
		if os.Getenv("MW_BENCH_LANES") == "0" {
			o.LaneBacklog = -1 // parking alone, for comparison
		}
		r := e.startPartitioned(testPacer(0, 2, nil, 0, nil), o)
		start := time.Now()
		e.publish(round("alone")...)
		tAlone := r.f.waitFor(b, 1000, isRound("alone"), 5*time.Minute).Sub(start)

		rss0, cpu0 := rssMiB(), cpuSeconds()
		const chunk = 50_000
		for i := 0; i < backlogN; i += chunk {
			var js []jobs.Job
			for k := i; k < min(i+chunk, backlogN); k++ {
				js = append(js, jobs.Job{ID: fmt.Sprint("slow-", k), URL: slow.url(fmt.Sprint("/slow/", k)), Target: fmt.Sprint("slow/", k)})
			}
			e.publish(js...)
		}
		start = time.Now()
		e.publish(round("mixed")...)
		tMixed := r.f.waitFor(b, 1000, isRound("mixed"), 30*time.Minute).Sub(start)
		// The authority in the cooling one's partition, against the others.
		mate := healthy[0].auth
		tMate := r.f.lastAt(func(f worker.Final) bool { return isRound("mixed")(f) && f.Authority == mate }).Sub(start)
		tOthers := r.f.lastAt(func(f worker.Final) bool { return isRound("mixed")(f) && f.Authority != mate }).Sub(start)
		waitCond(b, 60*time.Minute, "the backlog parked", func() bool {
			return parkedTotal(b, e) >= uint64(backlogN)
		})
		cpu := cpuSeconds() - cpu0
		// The first round runs cold (connections, consumers); the speed alone
		// is the faster of it and a round after, the conservative reading.
		start = time.Now()
		e.publish(round("after")...)
		tAlone = min(tAlone, r.f.waitFor(b, 1000, isRound("after"), 5*time.Minute).Sub(start))
		ps, _ := e.js.Stream(context.Background(), jobs.ParkStream)
		pi, _ := ps.Info(context.Background())
		lanes, _, inLanes := laneConsumers(b, e)
		b.ReportMetric(float64(inLanes), "in-lanes")
		b.ReportMetric(float64(pi.State.Msgs), "parked-one-by-one")
		b.Logf("%d lanes holding %d jobs; %d parked one by one", lanes, inLanes, pi.State.Msgs)
		shared := 0
		coolingPart := jobs.Partition(authority.KeyOf(slow.auth), jobs.DefaultPartitions)
		for _, o := range healthy {
			if jobs.Partition(authority.KeyOf(o.auth), jobs.DefaultPartitions) == coolingPart {
				shared++
			}
		}
		b.ReportMetric(float64(shared), "healthy-auths-in-cooling-partition")
		b.ReportMetric(float64(backlogN), "parked")
		b.ReportMetric(cpu/float64(backlogN)*1e6, "cpu-µs/parked-job")
		b.ReportMetric(rssMiB(), "rss-MiB")
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		// The Go heap in use: the worker's, the embedded server's and the
		// benchmark's own (the published jobs are garbage by now).
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-inuse-MiB")
		b.ReportMetric(rssMiB()-rss0, "rss-growth-MiB")
		b.ReportMetric(float64(pi.State.Bytes)/(1<<20), "parked-store-MiB")
		b.ReportMetric(tAlone.Seconds()/tMixed.Seconds(), "healthy-drain-ratio")
		b.Logf("behind the backlog, the healthy authority in the cooling partition was done after %v, the others after %v",
			tMate.Round(time.Millisecond), tOthers.Round(time.Millisecond))
		b.Logf("%d of 10 healthy authorities share the cooling one's partition", shared)
		b.Logf("%d parked: cpu %.1fs (%.0f µs each: publish, delivery, parking and acks, server included), store %.1f MiB, RSS %.0f MiB (+%.0f); healthy 1000 jobs alone %v, behind the backlog %v",
			backlogN, cpu, cpu/float64(backlogN)*1e6, float64(pi.State.Bytes)/(1<<20), rssMiB(), rssMiB()-rss0, tAlone.Round(time.Millisecond), tMixed.Round(time.Millisecond))
	}
}

// podHooks serve a cluster.Manager's partitions with an in-process worker.
type podHooks struct {
	e *env
	w *worker.Worker
}

func (h *podHooks) Acquired(ctx context.Context, p int, since time.Time) error {
	c, err := jobs.EnsurePartitionConsumer(ctx, h.e.js, p, &jobs.ConsumerOptions{AckWait: 30 * time.Second}, 0)
	if err != nil {
		return err
	}
	return h.w.AddPartition(p, c, since)
}
func (h *podHooks) Release(ctx context.Context, p int) { h.w.RemovePartition(ctx, p) }
func (h *podHooks) Status() []byte                     { return []byte(`{}`) }

// BenchmarkPods compares the aggregate jobs/s of 3 pods with 1 pod on
// 1,000 authorities at floor 0, side by side in one run: each pod is a
// worker with its own pacer, NATS connection and lease manager on real
// KV, as `run` wires them; only the process boundary is missing.
//
//	go test -run '^$' -bench Pods -benchtime 3000x ./worker/
func BenchmarkPods(b *testing.B) {
	for _, pods := range []int{1, 3} {
		b.Run(fmt.Sprint(pods, "pods"), func(b *testing.B) {
			e := newEnv(b, 30*time.Second)
			if _, err := jobs.EnsureWork(context.Background(), e.js, &jobs.WorkOptions{LeaseTTL: 2 * time.Second}); err != nil {
				b.Fatal(err)
			}
			kv := func(name string) cluster.Store {
				s, err := e.js.KeyValue(context.Background(), name)
				if err != nil {
					b.Fatal(err)
				}
				return cluster.KV{KeyValue: s}
			}
			origins := make([]*origin, 1000)
			for i := range origins {
				origins[i] = newOrigin(b)
			}
			var (
				all  []*running
				mgrs []*cluster.Manager
			)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for i := range pods {
				var mgr *cluster.Manager
				f := fetch.New(&fetch.Options{AllowPrivate: true})
				reg := prometheus.NewRegistry()
				w, err := worker.New(worker.Deps{JS: e.js, Fetcher: f, Target: e.target, Pacer: testPacer(0, 2, nil, 0, nil),
					Owns: func(p int) bool { return mgr != nil && mgr.Owns(p) }},
					&worker.Options{Partitions: jobs.DefaultPartitions, Concurrency: 16, Registerer: reg, Logger: testLogger(b)})
				if err != nil {
					b.Fatal(err)
				}
				r := &running{w: w, f: &finals{}, reg: reg, done: make(chan struct{})}
				worker.SetFinalHook(w, r.f.add)
				go func() { r.err = w.Run(ctx); close(r.done) }()
				for w.Ready() != nil {
					time.Sleep(time.Millisecond)
				}
				mgr, err = cluster.New(kv(jobs.LeasesBucket), kv(jobs.PodsBucket), &podHooks{e: e, w: w},
					cluster.Options{PodID: fmt.Sprint("pod-", i), TTL: 2 * time.Second})
				if err != nil {
					b.Fatal(err)
				}
				go mgr.Run(ctx)
				all, mgrs = append(all, r), append(mgrs, mgr)
			}
			// The pods balanced before the clock starts: each serves its
			// share (cluster.Manager.Serving) and every partition is held
			// once. Waited for, not assumed after 3 s of wall time.
			balanced := func() bool {
				held := 0
				for _, m := range mgrs {
					if m.Serving() != nil {
						return false
					}
					held += len(m.Owned())
				}
				return held == jobs.DefaultPartitions
			}
			waitCond(b, time.Minute, "the pods balanced", balanced)
			var js []jobs.Job
			for i := range b.N {
				o := origins[i%len(origins)]
				js = append(js, jobs.Job{ID: fmt.Sprint("j-", i), URL: o.url(fmt.Sprint("/b/", i)), Target: fmt.Sprint("b/", i)})
			}
			b.ResetTimer()
			start := time.Now()
			e.publish(js...)
			for {
				n := 0
				for _, r := range all {
					n += len(r.f.snapshot())
				}
				if n >= b.N {
					break
				}
				if time.Since(start) > 10*time.Minute {
					b.Fatalf("%d of %d jobs done", n, b.N)
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
		})
	}
}
