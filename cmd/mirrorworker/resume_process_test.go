package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

// resumeSizeEnv sets TestProcessResumesACutBody's body size in MiB.
const resumeSizeEnv = "MW_RESUME_TEST_MIB"

// patternBody is a body of size bytes that any range of can be served
// without holding it: a 1 MiB random block, repeated.
type patternBody struct {
	block []byte
	size  int64
}

func newPatternBody(size int64) patternBody {
	b := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{39}).Read(b)
	return patternBody{block: b, size: size}
}

// writeFrom writes bytes from..limit-1 of the body to w.
func (p patternBody) writeFrom(w io.Writer, from, limit int64) (int64, error) {
	var n int64
	for off := from; off < limit; {
		i := off % int64(len(p.block))
		chunk := p.block[i:min(int64(len(p.block)), i+limit-off)]
		m, err := w.Write(chunk)
		n += int64(m)
		off += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (p patternBody) sha256() string {
	h := sha256.New()
	p.writeFrom(h, 0, p.size)
	return hex.EncodeToString(h.Sum(nil))
}

// cuttingOrigin serves one object with a strong ETag, honouring Range
// with If-Range, over connections it speaks HTTP/1.1 on by hand so that
// it can reset one: the first answer is cut, with a TCP reset, after cutAt
// bytes of the body. It counts the body bytes it wrote and keeps every
// request's Range header.
type cuttingOrigin struct {
	body   patternBody
	etag   string
	cutAt  int64
	ln     net.Listener
	served atomic.Int64
	mu     sync.Mutex
	ranges []string // each request's Range ("" for none)
}

func newCuttingOrigin(t *testing.T, body patternBody, cutAt int64) *cuttingOrigin {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &cuttingOrigin{body: body, etag: `"resume-v1"`, cutAt: cutAt, ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go o.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return o
}

func (o *cuttingOrigin) requests() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.ranges...)
}

func (o *cuttingOrigin) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		o.mu.Lock()
		o.ranges = append(o.ranges, req.Header.Get("Range"))
		first := len(o.ranges) == 1
		o.mu.Unlock()
		from := int64(0)
		status := "200 OK"
		hdr := fmt.Sprintf("ETag: %s\r\nContent-Type: application/octet-stream\r\n", o.etag)
		if r, ok := strings.CutPrefix(req.Header.Get("Range"), "bytes="); ok && req.Header.Get("If-Range") == o.etag {
			if n, err := strconv.ParseInt(strings.TrimSuffix(r, "-"), 10, 64); err == nil && n < o.body.size {
				from, status = n, "206 Partial Content"
				hdr += fmt.Sprintf("Content-Range: bytes %d-%d/%d\r\n", n, o.body.size-1, o.body.size)
			}
		}
		bw := bufio.NewWriterSize(c, 256<<10)
		fmt.Fprintf(bw, "HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n", status, hdr, o.body.size-from)
		limit := o.body.size
		if first {
			limit = o.cutAt
		}
		n, err := o.body.writeFrom(bw, from, limit)
		if err == nil {
			err = bw.Flush()
		}
		o.served.Add(n)
		if err != nil || first {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // a reset, not an orderly end
			}
			return
		}
	}
}

// TestProcessResumesACutBody is issue 39's resume check: a `mirrorworker
// run` pod fetches a 1 GiB body (or MW_RESUME_TEST_MIB) with its sha256
// and size; the origin resets the connection at 90%; the retry asks for
// the rest with Range and If-Range, the origin serves about 10% more, not
// 100%, and the stored object is the whole body, its digest checked over
// all of it. resumed_bytes_total counts the bytes not fetched again.
func TestProcessResumesACutBody(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a worker process")
	}
	t.Parallel()
	mib := int64(1024)
	if s := os.Getenv(resumeSizeEnv); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a size in MiB", resumeSizeEnv, s)
		}
		mib = n
	}
	size := mib << 20
	cutAt := size * 9 / 10
	body := newPatternBody(size)
	sum := body.sha256()
	origin := newCuttingOrigin(t, body, cutAt)

	natsURL := publishCutJob(t, origin, "big.iso", sum, size)
	root := t.TempDir()
	t0 := time.Now()
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", root, "--log-level", "info")...)
	obj := filepath.Join(root, "big.iso")
	waitFor(t, 120*time.Second, "the object stored", func() bool {
		fi, err := os.Stat(obj)
		return err == nil && fi.Size() == size
	})
	took := time.Since(t0)
	_, metrics := httpGet(t, pod.start.AdminURL+"/metrics")
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}

	served := origin.served.Load()
	reqs := origin.requests()
	t.Logf("%d MiB body cut at %d bytes: the origin served %d bytes in %d requests (%.3f of the body; Range headers %q); stored in %v",
		mib, cutAt, served, len(reqs), float64(served)/float64(size), reqs, took.Round(time.Millisecond))
	// The retry starts where the worker's bytes stop: the cut, less what
	// the reset threw away in the sockets' buffers (a few MiB at most).
	var from int64 = -1
	if len(reqs) == 2 && reqs[0] == "" {
		if n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(reqs[1], "bytes="), "-"), 10, 64); err == nil {
			from = n
		}
	}
	if from > cutAt || from < cutAt-size/50 {
		t.Errorf("requests' Range headers %q, want none, then bytes=N- with N within 2%% below the cut at %d", reqs, cutAt)
	}
	// The cut answer, the rest, and at most what the reset lost in the
	// sockets' buffers on the way: well below a second whole body.
	if limit := size + size/20; served > limit {
		t.Errorf("the origin served %d bytes for a %d-byte body, above %d: the retry did not resume", served, size, limit)
	}
	f, err := os.Open(obj)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		t.Errorf("stored object's sha256 %s, want %s", got, sum)
	}
	if got := metricValue(metrics, "mirrorworker_resumed_bytes_total"); got != float64(from) {
		t.Errorf("resumed_bytes_total %v, want %d", got, from)
	}
	if es, _ := os.ReadDir(filepath.Join(root, ".mirrorworker", "partial")); len(es) > 0 {
		t.Errorf("kept starts left after the store: %d", len(es))
	}
}

// TestProcessS3ResumesACutBody: the same cut with an S3 target (the real
// versitygw): a 40 MiB body in parts of 5 MiB reset at 90% keeps its
// multipart upload with the whole parts received (30 or 35 MiB); the retry asks for the
// rest from there, sends only the rest's parts, and completes the object,
// the whole body's sha256 checked. The origin serves about 1.15 of the
// body (the cut, then the rest from the last whole part received) instead
// of 1.9.
func TestProcessS3ResumesACutBody(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a worker process and an S3 server")
	}
	t.Parallel()
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	s3Env(t, srv)
	size := int64(s3TestLarge)
	const part = 5 << 20 // s3TestPartSize
	cutAt := size * 9 / 10
	body := newPatternBody(size)
	sum := body.sha256()
	origin := newCuttingOrigin(t, body, cutAt)

	natsURL := publishCutJob(t, origin, "big.bin", sum, size)
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), append(s3Args(srv, "s3://mirror"), "--log-level", "info")...)...)
	c := srv.Client()
	waitFor(t, 90*time.Second, "the object stored", func() bool {
		return len(bucketObjects(t, c, "mirror", "")) == 1
	})
	_, metrics := httpGet(t, pod.start.AdminURL+"/metrics")
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}
	served, reqs := origin.served.Load(), origin.requests()
	t.Logf("%d-byte body cut at %d: the origin served %d bytes in %d requests (%.3f of the body; Range headers %q)",
		size, cutAt, served, len(reqs), float64(served)/float64(size), reqs)
	// The retry starts after the whole parts the worker received before
	// the cut: the bytes the reset threw away in socket buffers (a few
	// MiB) and those of the short part after them are fetched again.
	kept := int64(-1)
	if len(reqs) == 2 && reqs[0] == "" {
		if n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(reqs[1], "bytes="), "-"), 10, 64); err == nil {
			kept = n
		}
	}
	if kept%part != 0 || kept > cutAt || kept < cutAt-2*part {
		t.Errorf("requests' Range headers %q, want none, then bytes=N- with N a whole number of %d-byte parts within two parts below the cut at %d", reqs, part, cutAt)
	}
	if limit := size + size/4; served > limit {
		t.Errorf("the origin served %d bytes for a %d-byte body, above %d: the retry did not resume", served, size, limit)
	}
	got := getObject(t, c, "mirror", "big.bin")
	if s := sha256.Sum256(got); hex.EncodeToString(s[:]) != sum {
		t.Errorf("stored object (%d bytes) is not the body", len(got))
	}
	if got := metricValue(metrics, "mirrorworker_resumed_bytes_total"); got != float64(kept) {
		t.Errorf("resumed_bytes_total %v, want %d", got, kept)
	}
	if p := pendingUploadKeys(t, c, "mirror"); len(p) != 0 {
		t.Errorf("uploads left: %v", p)
	}
}

// publishCutJob enqueues the job of origin's body (its sha256 and size
// given) under key, on a standalone NATS server it starts, whose URL it
// returns.
func publishCutJob(t *testing.T, origin *cuttingOrigin, key, sum string, size int64) string {
	t.Helper()
	natsURL := externalNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{KeepExisting: true}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + origin.ln.Addr().String() + "/" + key
	if _, err := jobs.Publish(ctx, js, jobs.Job{URL: url, Target: key, SHA256: sum, Size: &size}); err != nil {
		t.Fatal(err)
	}
	return natsURL
}
