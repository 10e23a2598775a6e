package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestVerifyDeadLettersApart: an object missing because its job was
// dead-lettered (the origin answered 404) is reported apart from the
// missing, with its reason; a size changed behind the worker's back says
// which sizes differ, not "not found"; --repair re-enqueues the corrupt
// object's job and leaves the dead-lettered one, saying how to requeue it;
// --repair-dead-letters requeues it, and once the origin serves it, it is
// stored. Progress goes to stderr.
func TestVerifyDeadLettersApart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker")
	}
	t.Parallel()
	good := bytes.Repeat([]byte("g"), 1000)
	var fixed atomic.Bool
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/gone.bin" && !fixed.Load() {
			http.NotFound(w, r)
			return
		}
		w.Write(good)
	}))
	defer origin.Close()
	natsURL := externalNATS(t)
	root := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, log, done := runInProcess(t, ctx, workerArgs(natsURL, t.TempDir(), "--target", root, "--worker-id", "verify-dead")...)
	enqueueLines(t, natsURL, []string{
		fmt.Sprintf(`{"url":%q,"target":"o/good.bin"}`, origin.URL+"/good.bin"),
		fmt.Sprintf(`{"url":%q,"target":"o/gone.bin"}`, origin.URL+"/gone.bin"),
	})
	waitFor(t, time.Minute, "the good object stored and the other dead-lettered", func() bool {
		_, err := os.Stat(filepath.Join(root, "o", "good.bin"))
		out, _, _ := runCmd(t, nil, "dlq", "list", "--nats-url", natsURL)
		return err == nil && strings.Contains(out, "http_404")
	})
	// Longer behind the worker's back.
	f, err := os.OpenFile(filepath.Join(root, "o", "good.bin"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("more"))
	f.Close()

	verify := func(args ...string) (string, string, error) {
		vctx, vcancel := context.WithTimeout(context.Background(), time.Minute)
		defer vcancel()
		var stdout, stderr bytes.Buffer
		err := run(vctx, append([]string{"verify", "--nats-url", natsURL, "--target", root}, args...), noEnv, strings.NewReader(""), &stdout, &stderr)
		return stdout.String(), stderr.String(), err
	}
	out, errOut, err := verify()
	if exitCode(err) != 1 {
		t.Errorf("verify: exit %d (%v), want 1", exitCode(err), err)
	}
	for _, want := range []string{
		"dead-lettered o/gone.bin: job given up: http_404", "last status 404",
		"corrupt   o/good.bin: object is 1004 bytes, meta says 1000",
		"1 objects, 0 ok, 1 corrupt, 0 orphaned; 2 keys in MIRROR_JOBS, 0 missing, 1 dead-lettered",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not found") {
		t.Errorf("verify output says not found:\n%s", out)
	}
	if !strings.Contains(errOut, "verify: checked 1 objects") || !strings.Contains(err.Error(), "--repair-dead-letters") {
		t.Errorf("verify: %v; stderr lacks the progress summary:\n%s", err, errOut)
	}

	out, _, err = verify("--repair")
	if err != nil || !strings.Contains(out, "re-enqueued 1 of 1 jobs of missing and corrupt objects") ||
		!strings.Contains(out, "left 1 dead-lettered jobs in MIRROR_DLQ") {
		t.Fatalf("verify --repair: %v\n%s", err, out)
	}
	fixed.Store(true)
	out, _, err = verify("--repair-dead-letters")
	if err != nil || !strings.Contains(out, "requeued 1 of 1 dead-lettered jobs") {
		t.Fatalf("verify --repair-dead-letters: %v\n%s", err, out)
	}
	waitFor(t, time.Minute, "both objects stored again", func() bool {
		a, _ := os.ReadFile(filepath.Join(root, "o", "good.bin"))
		b, _ := os.ReadFile(filepath.Join(root, "o", "gone.bin"))
		return bytes.Equal(a, good) && bytes.Equal(b, good)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, log)
	}
}
