package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

// BenchmarkS3Throughput measures, side by side in one run, the worker end
// to end into a bucket (`mirrorworker run --target s3://...` in-process:
// embedded JetStream, default flags but --floor 0) and a raw pipeline of
// no project code into the same versitygw: 32 goroutines that pull from a
// JetStream pull consumer, GET with net/http keep-alive, PutObject the body
// with the SDK (path-style, no checksums) and ack. The backlog is the
// throughput benchmark's: one warm-up job per authority, then the measured
// jobs round robin over 1,000 authorities, 4 KiB bodies from loopback
// origin processes. The worker does what a mirror must and the raw
// pipeline does not: a HEAD for the conditional request, the sha256, the
// metadata. MW_BENCH_JOBS sets the measured jobs (default 5,000),
// MW_BENCH_ROUNDS the rounds (default 3, alternating which goes first).
//
//	go test -run '^$' -bench S3Throughput -benchtime 1x -timeout 30m -v ./cmd/mirrorworker/
func BenchmarkS3Throughput(b *testing.B) {
	const authorities, g = 1000, 32
	n := 5000
	if v, err := strconv.Atoi(os.Getenv("MW_BENCH_JOBS")); err == nil && v > 0 {
		n = v
	}
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("MW_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	srv := buckettest.Start(b)
	s3EnvB(b, srv)
	o := startBenchOrigin(b, authorities, 4<<10)
	bl := benchBacklog{origin: o, authorities: authorities, warm: authorities, measured: n}
	var raws, wks []pipelineResult
	var ratios []float64
	for r := range rounds {
		rawBucket, wkBucket := fmt.Sprintf("raw-%d", r), fmt.Sprintf("worker-%d", r)
		srv.CreateBucket(b, rawBucket)
		srv.CreateBucket(b, wkBucket)
		runWk := func() pipelineResult {
			dataDir := b.TempDir()
			publishBacklog(b, dataDir, bl.total(), bl.job)
			return runWorkerOn(b, dataDir, bl, []string{"--target", "s3://" + wkBucket, "--s3-endpoint", srv.Endpoint, "--s3-region", buckettest.Region}, false)
		}
		var raw, wk pipelineResult
		if r%2 == 0 {
			raw, wk = runRawS3Pipeline(b, bl, g, srv, rawBucket), runWk()
		} else {
			wk = runWk()
			raw = runRawS3Pipeline(b, bl, g, srv, rawBucket)
		}
		raws, wks = append(raws, raw), append(wks, wk)
		ratios = append(ratios, wk.rate()/raw.rate())
		b.Logf("round %d: raw %.0f jobs/s (%.0f µs CPU/job), worker %.0f jobs/s (%.0f µs CPU/job), ratio %.3f",
			r+1, raw.rate(), raw.cpuPerJob(), wk.rate(), wk.cpuPerJob(), ratios[r])
	}
	raw, wk := medianResult(raws), medianResult(wks)
	b.ReportMetric(raw.rate(), "raw_jobs/s")
	b.ReportMetric(wk.rate(), "worker_jobs/s")
	b.ReportMetric(median(ratios), "ratio")
	b.ReportMetric(slices.Min(ratios), "ratio_min")
	b.ReportMetric(slices.Max(ratios), "ratio_max")
	b.ReportMetric(raw.cpuPerJob(), "raw_cpu_µs/job")
	b.ReportMetric(wk.cpuPerJob(), "worker_cpu_µs/job")
}

// s3EnvB is s3Env for a benchmark.
func s3EnvB(b *testing.B, srv *buckettest.Server) {
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		b.Setenv(k, v)
	}
}

// rawS3Client is the raw pipelines' S3 client: path-style, no checksums,
// keep-alive connections for g goroutines.
func rawS3Client(srv *buckettest.Server, g int) *s3.Client {
	return s3.New(s3.Options{
		Region: buckettest.Region, BaseEndpoint: aws.String(srv.Endpoint), UsePathStyle: true,
		Credentials:                buckettest.Credentials(),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		HTTPClient:                 &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: g, DisableCompression: true}},
	})
}

// runRawS3Pipeline drains bl with g goroutines and no project code: pull,
// GET, PutObject, ack.
func runRawS3Pipeline(b *testing.B, bl benchBacklog, g int, srv *buckettest.Server, bkt string) pipelineResult {
	return runRaw(b, bl, g, "raw S3 pipeline", func(_ string, hc *http.Client) func(rawJob) error {
		sc := rawS3Client(srv, g)
		return func(j rawJob) error {
			resp, err := rawGet(hc, j.URL)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			_, err = sc.PutObject(context.Background(), &s3.PutObjectInput{Bucket: &bkt, Key: &j.Target, Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body)))})
			return err
		}
	})
}

// largeBody writes size deterministic bytes to w, 1 MiB at a time, never
// holding more.
func largeBody(w io.Writer, size int64) (int64, error) {
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*131 + i>>9)
	}
	var n int64
	for n < size {
		k := min(int64(len(chunk)), size-n)
		chunk[0] = byte(n >> 20) // each MiB differs
		m, err := w.Write(chunk[:k])
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// settle prepares a timed run: the dirty pages of the last one written
// back (sync), so that a pipeline never pays for the other's writes, and
// freed heap returned to the OS with the peak RSS (VmHWM, Linux 4.0 and
// later) reset, so that the next peak is the next run's own.
func settle() {
	syscall.Sync()
	debug.FreeOSMemory()
	os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// BenchmarkS3LargeObject stores one large object (256 MiB, or
// MW_BENCH_S3_LARGE, e.g. 1GiB) from a loopback origin that streams it
// without holding it, side by side: `mirrorworker run --target s3://...`
// in-process (a multipart upload of 16 MiB parts, 4 in flight, checked
// against the job's size and sha256 before it is completed) and a raw
// streamed multipart upload of the same bytes with the SDK and no project
// code (16 MiB parts, 4 in flight, no checksums). MW_BENCH_ROUNDS rounds
// (default 2) alternate which goes first, so that neither always meets
// the other's dirty pages. Metrics: MB/s of both (medians), the median
// ratio of the rounds (worker/raw) with its min and max, and the
// process's peak RSS during each (VmHWM after a reset; the process holds
// the origin and the embedded NATS server too).
//
//	MW_BENCH_S3_LARGE=1GiB go test -run '^$' -bench S3LargeObject -benchtime 1x -timeout 30m -v ./cmd/mirrorworker/
func BenchmarkS3LargeObject(b *testing.B) {
	size := int64(256 << 20)
	if v := os.Getenv("MW_BENCH_S3_LARGE"); v != "" {
		var bs byteSize
		if err := bs.Set(v); err != nil {
			b.Fatalf("MW_BENCH_S3_LARGE: %v", err)
		}
		size = int64(bs)
	}
	rounds := 2
	if v, err := strconv.Atoi(os.Getenv("MW_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	h := sha256.New()
	largeBody(h, size)
	sum := hex.EncodeToString(h.Sum(nil))
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.Header().Set("ETag", `"`+sum[:16]+`"`)
		largeBody(w, size)
	}))
	defer origin.Close()
	srv := buckettest.Start(b)
	srv.CreateBucket(b, "raw")
	srv.CreateBucket(b, "worker")
	s3EnvB(b, srv)
	c := rawS3Client(srv, 8)
	ctx := context.Background()

	natsURL := externalNATSB(b)
	rctx, cancel := context.WithCancel(ctx)
	lw := newLogWatch()
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		run(rctx, []string{"run", "--nats-url", natsURL, "--data-dir", b.TempDir(), "--admin-addr", "127.0.0.1:0", "--floor", "0",
			"--allow-private-networks", "--target", "s3://worker", "--s3-endpoint", srv.Endpoint, "--s3-region", buckettest.Region}, noEnv, strings.NewReader(""), io.Discard, lw)
	}()
	defer func() { cancel(); <-exited }()
	select {
	case <-lw.started:
	case <-time.After(time.Minute):
		b.Fatalf("no start line; log:\n%s", lw)
	}

	var rawT, wkT, ratios []float64
	var rawRSS, wkRSS uint64
	for r := range rounds {
		key := "large-" + strconv.Itoa(r)
		var raw, wk time.Duration
		if r%2 == 0 {
			raw = rawLargeUpload(b, c, origin.URL+"/large", key)
			rawRSS = max(rawRSS, procStatus("VmHWM"))
			wk = workerLargeStore(b, c, natsURL, origin.URL+"/"+key, key, sum, size, lw)
			wkRSS = max(wkRSS, procStatus("VmHWM"))
		} else {
			wk = workerLargeStore(b, c, natsURL, origin.URL+"/"+key, key, sum, size, lw)
			wkRSS = max(wkRSS, procStatus("VmHWM"))
			raw = rawLargeUpload(b, c, origin.URL+"/large", key)
			rawRSS = max(rawRSS, procStatus("VmHWM"))
		}
		rawT, wkT = append(rawT, raw.Seconds()), append(wkT, wk.Seconds())
		ratios = append(ratios, raw.Seconds()/wk.Seconds())
		b.Logf("round %d, %d bytes: raw %s (%.1f MB/s), worker %s (%.1f MB/s), ratio %.3f", r+1, size,
			raw.Round(time.Millisecond), float64(size)/1e6/raw.Seconds(), wk.Round(time.Millisecond), float64(size)/1e6/wk.Seconds(), ratios[r])
		for _, bk := range []string{"raw", "worker"} { // no round reads the last one's bytes
			c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bk), Key: &key})
		}
	}
	mb := float64(size) / 1e6
	b.ReportMetric(mb/median(rawT), "raw_MB/s")
	b.ReportMetric(mb/median(wkT), "worker_MB/s")
	b.ReportMetric(median(ratios), "ratio")
	b.ReportMetric(slices.Min(ratios), "ratio_min")
	b.ReportMetric(slices.Max(ratios), "ratio_max")
	b.ReportMetric(float64(rawRSS)/(1<<20), "raw_peak_rss_MiB")
	b.ReportMetric(float64(wkRSS)/(1<<20), "worker_peak_rss_MiB")
}

// rawLargeUpload GETs url and uploads the body to raw/key as a multipart
// upload of 16 MiB parts, 4 in flight, with no project code; it returns
// the time taken. The peak RSS is reset first.
func rawLargeUpload(b *testing.B, c *s3.Client, url, key string) time.Duration {
	b.Helper()
	ctx := context.Background()
	const part, inFlight = 16 << 20, 4
	settle()
	t0 := time.Now()
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	up, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("raw"), Key: &key})
	if err != nil {
		b.Fatal(err)
	}
	var (
		mu    sync.Mutex
		parts []types.CompletedPart
		wg    sync.WaitGroup
		sem   = make(chan struct{}, inFlight)
		uerr  atomic.Value
		bufs  = sync.Pool{New: func() any { b := make([]byte, part); return &b }}
	)
	for num := int32(1); ; num++ {
		bp := bufs.Get().(*[]byte)
		k, rerr := io.ReadFull(resp.Body, *bp)
		if k > 0 {
			sem <- struct{}{}
			wg.Add(1)
			go func(num int32, bp *[]byte, k int) {
				defer func() { <-sem; bufs.Put(bp); wg.Done() }()
				out, err := c.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String("raw"), Key: &key, UploadId: up.UploadId,
					PartNumber: aws.Int32(num), Body: bytes.NewReader((*bp)[:k]), ContentLength: aws.Int64(int64(k))})
				if err != nil {
					uerr.Store(err)
					return
				}
				mu.Lock()
				parts = append(parts, types.CompletedPart{PartNumber: aws.Int32(num), ETag: out.ETag})
				mu.Unlock()
			}(num, bp, k)
		}
		if rerr != nil {
			break
		}
	}
	wg.Wait()
	if err, _ := uerr.Load().(error); err != nil {
		b.Fatal(err)
	}
	slices.SortFunc(parts, func(a, b types.CompletedPart) int { return int(*a.PartNumber - *b.PartNumber) })
	if _, err := c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String("raw"), Key: &key, UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// workerLargeStore enqueues one job for url into the running worker and
// returns the time from its publication to the object visible under key.
// The peak RSS is reset first.
func workerLargeStore(b *testing.B, c *s3.Client, natsURL, url, key, sum string, size int64, lw *logWatch) time.Duration {
	b.Helper()
	ctx := context.Background()
	settle()
	t0 := time.Now()
	line := fmt.Sprintf(`{"url":%q,"target":%q,"sha256":%q,"size":%d}`, url, key, sum, size)
	var out, errOut strings.Builder
	if err := run(ctx, []string{"enqueue", "--nats-url", natsURL}, noEnv, strings.NewReader(line+"\n"), &out, &errOut); err != nil {
		b.Fatalf("enqueue: %v %s", err, errOut.String())
	}
	deadline := time.Now().Add(20 * time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("worker"), Key: &key}); err == nil {
			return time.Since(t0)
		}
		if time.Now().After(deadline) {
			b.Fatalf("the worker did not store the object; log:\n%s", lw)
		}
		<-tick.C
	}
}

// externalNATSB is externalNATS for a benchmark.
func externalNATSB(b *testing.B) string {
	b.Helper()
	e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: b.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Shutdown)
	return e.ClientURL()
}
