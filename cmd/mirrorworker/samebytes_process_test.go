package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

// TestProcessSameBytesFetchedOnce, for a file target and a bucket: a real
// `run` given 1,000 jobs over 100 distinct bodies (each body under ten
// names, next to each other in the queue, so that they arrive while their
// body is still being fetched and wait for it) asks the origin 100
// times; the other 900 are copies within the target (a local copy; a
// server-side CopyObject), every object byte-exact and its metadata its
// own job's. verify then finds the mirror intact and rebuilds the index.
func TestProcessSameBytesFetchedOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes and an S3 server")
	}
	t.Parallel()
	const distinct, names = 100, 10
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			origin := newS3Origin(t)
			type job struct {
				key  string
				body []byte
			}
			var js []job
			var lines []string
			for d := range distinct {
				for n := range names {
					b := s3Body(fmt.Sprintf("body-%d", d), 2000+d*37)
					name := fmt.Sprintf("mirror%d/pkg-%03d.tgz", n, d)
					origin.mu.Lock()
					origin.bodies[name] = b
					origin.mu.Unlock()
					sum := sha256.Sum256(b)
					js = append(js, job{key: "objects/" + name, body: b})
					lines = append(lines, fmt.Sprintf(`{"url":%q,"target":%q,"sha256":%q,"size":%d}`,
						origin.URL+"/o/"+name, "objects/"+name, hex.EncodeToString(sum[:]), len(b)))
				}
			}
			var (
				targetArgs []string
				read       func(key string) ([]byte, error)
				verifyArgs []string
			)
			switch kind {
			case "file":
				root := t.TempDir()
				targetArgs = []string{"--target", root}
				read = func(key string) ([]byte, error) { return os.ReadFile(filepath.Join(root, key)) }
			case "s3":
				srv := buckettest.Start(t)
				srv.CreateBucket(t, "mirror")
				s3Env(t, srv)
				targetArgs = s3Args(srv, "s3://mirror/m")
				// versitygw's posix backend keeps each object as a file.
				read = func(key string) ([]byte, error) { return os.ReadFile(filepath.Join(srv.Root, "mirror", "m", key)) }
			}
			natsURL := externalNATS(t)
			enqueueLines(t, natsURL, lines)
			w := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), append(targetArgs, "--worker-id", "same-bytes-"+kind)...)...)
			jsc, closeConn := connectJS(t, natsURL)
			defer closeConn()
			waitFor(t, 3*time.Minute, "every job done", func() bool {
				q, err := readQueue(context.Background(), jsc)
				return err == nil && q.pending == 0 && q.ackPending == 0
			})
			if q, err := readQueue(context.Background(), jsc); err != nil || q.dlq != 0 {
				t.Errorf("dead letters: %d (%v), want 0", q.dlq, err)
			}
			for _, j := range js {
				if b, err := read(j.key); err != nil || !bytes.Equal(b, j.body) {
					t.Errorf("%s: %d bytes (%v), want %d exactly as served", j.key, len(b), err, len(j.body))
				}
			}
			requests := 0
			origin.mu.Lock()
			for _, n := range origin.full {
				requests += n
			}
			for _, n := range origin.not {
				requests += n
			}
			origin.mu.Unlock()
			if requests != distinct {
				t.Errorf("the origin answered %d requests for %d jobs over %d bodies, want %d", requests, len(js), distinct, distinct)
			}
			// The server counts an ack when it gets it; the worker counts the
			// job's outcome once the ack is confirmed, a moment later: the
			// last job's count may trail the empty queue.
			wants := []string{
				fmt.Sprintf(`mirrorworker_jobs_total{outcome="stored"} %d`, distinct),
				fmt.Sprintf(`mirrorworker_jobs_total{outcome="copied"} %d`, len(js)-distinct),
			}
			var metrics string
			counted := func() bool {
				_, metrics = httpGet(t, w.start.AdminURL+"/metrics")
				for _, want := range wants {
					if !strings.Contains(metrics, "\n"+want+"\n") {
						return false
					}
				}
				return true
			}
			deadline := time.Now().Add(10 * time.Second)
			for !counted() && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			for _, want := range wants {
				if !strings.Contains(metrics, "\n"+want+"\n") {
					t.Errorf("metrics lack %q:\n%s", want, grepLines(metrics, "mirrorworker_jobs_total"))
				}
			}
			if got := w.log.messages("object copied"); len(got) != len(js)-distinct {
				t.Errorf("%d 'object copied' lines, want %d", len(got), len(js)-distinct)
			} else if !strings.Contains(got[0], `"from":"objects/mirror`) {
				t.Errorf("an 'object copied' line names no key it copied from: %s", got[0])
			}
			t.Logf("%d jobs over %d bodies: %d origin requests; %s", len(js), distinct, requests, grepLines(metrics, `mirrorworker_jobs_total{outcome="deferred"}`))
			if _, err := w.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
				t.Errorf("worker exit: %v", err)
			}

			verifyArgs = append([]string{"--nats-url", natsURL}, targetArgs...)
			out, err := runVerify(t, verifyArgs...)
			if err != nil || !strings.Contains(out, fmt.Sprintf("%d objects, %d ok, 0 corrupt", len(js), len(js))) ||
				!strings.Contains(out, fmt.Sprintf("sha256 index rebuilt: %d entries; 0 added, 0 stale dropped, 0 pointed at another key", distinct)) {
				t.Errorf("verify after the copies: %v\n%s", err, out)
			}
		})
	}
}
