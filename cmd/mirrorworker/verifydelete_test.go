package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

// TestDeleteThenVerify, for a file target and a bucket (the real versitygw):
// `enqueue --delete URL --target KEY` removes a stored object through a
// running worker, and verify then counts its key as deleted, with a
// tombstone, not missing, and exits 0. A delete left undone (the object
// put back behind the worker's back) is "undeleted", exit 1.
func TestDeleteThenVerify(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker and an S3 server")
	}
	t.Parallel()
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			origin := newS3Origin(t)
			var js []s3Job
			var lines []string
			for i := range 3 {
				name := fmt.Sprintf("d-%d.bin", i)
				j := s3Job{name: name, path: "/o/" + name, body: origin.add(name, 500+i), withSum: true}
				js = append(js, j)
				lines = append(lines, j.line(origin.URL))
			}
			var (
				targetArgs []string
				objPath    func(key string) string
			)
			switch kind {
			case "file":
				root := t.TempDir()
				targetArgs = []string{"--target", root}
				objPath = func(key string) string { return filepath.Join(root, key) }
			case "s3":
				srv := buckettest.Start(t)
				srv.CreateBucket(t, "mirror")
				s3Env(t, srv)
				targetArgs = s3Args(srv, "s3://mirror/m")
				objPath = func(key string) string { return filepath.Join(srv.Root, "mirror", "m", key) }
			}
			natsURL := externalNATS(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, _, done := runInProcess(t, ctx, append([]string{
				"--nats-url", natsURL, "--data-dir", t.TempDir(), "--admin-addr", "127.0.0.1:0",
				"--allow-private-networks", "--floor", "0", "--worker-id", "delete-" + kind,
			}, targetArgs...)...)
			enqueueLines(t, natsURL, lines)
			waitFor(t, time.Minute, "every object stored", func() bool {
				for _, j := range js {
					if b, err := os.ReadFile(objPath("objects/" + j.name)); err != nil || !bytes.Equal(b, j.body) {
						return false
					}
				}
				return true
			})
			enqueueOK(t, natsURL, "--delete", origin.URL+js[1].path, "--target", "objects/"+js[1].name)
			waitFor(t, time.Minute, "the object deleted", func() bool {
				_, err := os.Stat(objPath("objects/" + js[1].name))
				return errors.Is(err, os.ErrNotExist)
			})
			verifyArgs := append([]string{"--nats-url", natsURL}, targetArgs...)
			out, err := runVerify(t, verifyArgs...)
			if err != nil || !strings.Contains(out, "2 objects, 2 ok, 0 corrupt, 0 orphaned; 3 keys in MIRROR_JOBS, 0 missing, 0 dead-lettered, 1 deleted (1 with a tombstone), 0 undeleted") {
				t.Errorf("verify after a delete: %v\n%s", err, out)
			}
			// Put the deleted object back behind the worker's back.
			if err := os.WriteFile(objPath("objects/"+js[1].name), js[1].body, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err = runVerify(t, verifyArgs...)
			if exitCode(err) != 1 || !strings.Contains(out, "undeleted objects/"+js[1].name) {
				t.Errorf("verify of an object its delete should have removed: exit %d (%v)\n%s", exitCode(err), err, out)
			}
			cancel()
			<-done
		})
	}
}
