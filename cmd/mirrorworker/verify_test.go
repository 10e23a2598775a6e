package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

func runVerify(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, append([]string{"verify"}, args...), noEnv, strings.NewReader(""), &stdout, &stderr)
	if stderr.Len() > 0 {
		t.Logf("verify stderr:\n%s", stderr.String())
	}
	return stdout.String(), err
}

// TestVerifyFindsAndRepairs, for a file target and a bucket: verify finds
// an object deleted, one whose bytes were changed behind the worker's back
// and an orphan no job names, exits 1; --repair re-enqueues the jobs of
// the first two, a running worker stores them again, byte-exact, and
// verify then finds only the orphan (which it never removes).
func TestVerifyFindsAndRepairs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker and an S3 server")
	}
	t.Parallel()
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			origin := newS3Origin(t)
			var js []s3Job
			var lines []string
			for i := range 5 {
				name := fmt.Sprintf("v-%d.bin", i)
				j := s3Job{name: name, path: "/o/" + name, body: origin.add(name, 1000+i*100), withSum: i != 4}
				js = append(js, j)
				lines = append(lines, j.line(origin.URL))
			}
			var (
				targetArgs []string
				objPath    func(key string) string // the object's file: the file target's, or versitygw's posix file
				putOrphan  func()
			)
			switch kind {
			case "file":
				root := t.TempDir()
				targetArgs = []string{"--target", root}
				objPath = func(key string) string { return filepath.Join(root, key) }
				putOrphan = func() {
					os.MkdirAll(filepath.Join(root, "extra"), 0o755)
					if err := os.WriteFile(filepath.Join(root, "extra", "orphan.bin"), []byte("nobody asked"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			case "s3":
				srv := buckettest.Start(t)
				srv.CreateBucket(t, "mirror")
				s3Env(t, srv)
				targetArgs = s3Args(srv, "s3://mirror/m")
				objPath = func(key string) string { return filepath.Join(srv.Root, "mirror", "m", key) }
				putOrphan = func() {
					_, err := srv.Client().PutObject(context.Background(), &s3.PutObjectInput{
						Bucket: aws.String("mirror"), Key: aws.String("m/extra/orphan.bin"), Body: strings.NewReader("nobody asked")})
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			natsURL := externalNATS(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, log, done := runInProcess(t, ctx, append([]string{
				"--nats-url", natsURL, "--data-dir", t.TempDir(), "--admin-addr", "127.0.0.1:0",
				"--allow-private-networks", "--floor", "0", "--worker-id", "verify-" + kind,
			}, targetArgs...)...)
			enqueueLines(t, natsURL, lines)
			stored := func(j s3Job) bool {
				b, err := os.ReadFile(objPath("objects/" + j.name))
				return err == nil && bytes.Equal(b, j.body)
			}
			waitFor(t, time.Minute, "every object stored", func() bool {
				for _, j := range js {
					if !stored(j) {
						return false
					}
				}
				return true
			})
			verifyArgs := append([]string{"--nats-url", natsURL}, targetArgs...)
			out, err := runVerify(t, verifyArgs...)
			if err != nil || !strings.Contains(out, "5 objects, 5 ok, 0 corrupt, 0 orphaned; 5 keys in MIRROR_JOBS, 0 missing") {
				t.Fatalf("verify of an intact mirror: %v\n%s", err, out)
			}

			// Damage behind the worker's back.
			if err := os.Remove(objPath("objects/v-0.bin")); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"v-1.bin", "v-4.bin"} { // with and without a sha256 in the job
				f, err := os.OpenFile(objPath("objects/"+name), os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteAt([]byte("XXXX"), 10) // same size, other bytes
				f.Close()
			}
			putOrphan()

			out, err = runVerify(t, verifyArgs...)
			if exitCode(err) != 1 {
				t.Errorf("verify of a damaged mirror: exit %d (%v), want 1", exitCode(err), err)
			}
			for _, want := range []string{"missing   objects/v-0.bin", "corrupt   objects/v-1.bin: sha256 ", "corrupt   objects/v-4.bin: sha256 ",
				"orphaned  extra/orphan.bin", "5 objects, 2 ok, 2 corrupt, 1 orphaned; 5 keys in MIRROR_JOBS, 1 missing"} {
				if !strings.Contains(out, want) {
					t.Errorf("verify output lacks %q:\n%s", want, out)
				}
			}
			out, err = runVerify(t, append(verifyArgs, "--repair")...)
			if err != nil || !strings.Contains(out, "re-enqueued 3 of 3 jobs") {
				t.Fatalf("verify --repair: %v\n%s", err, out)
			}
			waitFor(t, time.Minute, "the repaired objects stored again", func() bool {
				return stored(js[0]) && stored(js[1]) && stored(js[4])
			})
			waitFor(t, time.Minute, "verify finding the orphan only", func() bool {
				out, err = runVerify(t, verifyArgs...)
				return err == nil && strings.Contains(out, "6 objects, 5 ok, 0 corrupt, 1 orphaned; 5 keys in MIRROR_JOBS, 0 missing")
			})
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("run: %v\n%s", err, log)
			}
		})
	}
}
