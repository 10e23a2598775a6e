//go:build soak

package main

// The crash soak of issue 13 (R1): SIGKILLs at random moments during a
// long run of a real `mirrorworker run` process. Too slow for `make test`,
// so it is built only with the soak tag:
//
//	go test -tags soak -run TestSoakCrash -v -timeout 60m ./cmd/mirrorworker/
//
// MW_SOAK_JOBS (10000) and MW_SOAK_KILLS (20) change its size.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
)

// soakSize is object n's length: log-uniform from 1 KiB to 4 MiB.
func soakSize(n int) int {
	r := rand.New(rand.NewPCG(uint64(n), 0x50a4))
	return int(1024 * math.Pow(4096, r.Float64()))
}

// soakBody is object n's bytes, the same on every call.
func soakBody(n int) []byte {
	b := make([]byte, soakSize(n))
	var seed [32]byte
	copy(seed[:], strconv.Itoa(n))
	rand.NewChaCha8(seed).Read(b)
	return b
}

func soakKey(n int) string { return fmt.Sprintf("soak/%02d/%05d.bin", n%100, n) }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestSoakCrash(t *testing.T) {
	n := envInt("MW_SOAK_JOBS", 10000)
	kills := envInt("MW_SOAK_KILLS", 20)
	began := time.Now()

	// The expected bytes, as sums: the jobs carry size and sha256, so the
	// worker itself refuses other bytes, and the test checks every file.
	sums := make([]string, n)
	var total int64
	for i := range n {
		b := soakBody(i)
		s := sha256.Sum256(b)
		sums[i] = hex.EncodeToString(s[:])
		total += int64(len(b))
	}
	t.Logf("%d jobs, %d bytes (%.1f MiB mean), sums in %s", n, total, float64(total)/float64(n)/(1<<20), time.Since(began).Round(time.Millisecond))

	var full200, notMod atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/o/"))
		if err != nil || i < 0 || i >= n {
			http.NotFound(w, r)
			return
		}
		etag := `"` + sums[i][:16] + `"`
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			notMod.Add(1)
			w.WriteHeader(http.StatusNotModified)
			return
		}
		b := soakBody(i)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		if _, err := w.Write(b); err == nil {
			full200.Add(1)
		}
	}))
	t.Cleanup(func() { origin.CloseClientConnections(); origin.Close() })

	natsURL := externalNATS(t)
	publishSoak(t, natsURL, origin.URL, n, sums)

	dataDir := t.TempDir()
	args := workerArgs(natsURL, dataDir, "--max-in-flight", "16", "--ack-wait", "5s", "--log-level", "info")
	p := startWorkerProcess(t, args...)
	root := p.start.Mirror
	tmpDir := filepath.Join(root, mirror.ReservedDir, "tmp")

	// Kill points: a random amount of completed downloads in each of kills
	// equal stretches of the run, and at least one download by every
	// restarted worker before it is killed.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	points := make([]int64, kills)
	for k := range points {
		points[k] = int64(0.95 * float64(n) * (float64(k) + rng.Float64()) / float64(kills))
	}
	var leftovers, partial int
	for k, at := range points {
		at = max(at, full200.Load()+1)
		waitFor(t, 10*time.Minute, fmt.Sprintf("%d downloads before kill %d", at, k+1), func() bool { return full200.Load() >= at })
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond) // a random moment, not a wait for a condition
		if _, err := p.signalAndWait(t, syscall.SIGKILL, 30*time.Second); err == nil {
			t.Fatal("a killed worker reported success")
		}
		// Nothing partial at a final path: every visible object has its
		// full length (the sums are checked at the end).
		partial += soakCheckSizes(t, root, n)
		left := soakTemps(t, tmpDir)
		leftovers += len(left)
		p = startWorkerProcess(t, args...)
		// The start cleaned every temporary file the killed worker left.
		for _, name := range left {
			if _, err := os.Stat(filepath.Join(tmpDir, name)); err == nil {
				t.Errorf("after restart %d: temporary file %s left by the killed worker is still there", k+1, name)
			}
		}
		t.Logf("kill %2d at %5d downloads (%s): %d temporary files left by it", k+1, full200.Load(), time.Since(began).Round(time.Second), len(left))
	}
	lastKill := time.Now()
	soakWaitDrained(t, natsURL, root, n, 30*time.Minute)
	drained := time.Since(lastKill)
	if _, err := p.signalAndWait(t, syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}

	// 0 lost, 0 corrupt, nothing else in the mirror, no temporary file.
	lost, corrupt := 0, 0
	for i := range n {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(soakKey(i))))
		if err != nil {
			lost++
			continue
		}
		if s := sha256.Sum256(b); hex.EncodeToString(s[:]) != sums[i] {
			corrupt++
		}
	}
	extra := len(mirrorFilesNames(t, root)) - (n - lost)
	temps := len(soakTemps(t, tmpDir))
	q := soakQueue(t, natsURL)
	t.Logf("R1 figures: %d jobs, %d bytes, %d SIGKILLs, %s in all, drained %s after the last kill", n, total, kills, time.Since(began).Round(time.Second), drained.Round(time.Second))
	t.Logf("R1 figures: lost %d, corrupt %d, extra files %d, partial files seen after kills %d, temporary files left at the end %d, dead letters %d", lost, corrupt, extra, partial, temps, q.dlq)
	t.Logf("R1 figures: origin served %d complete 200s (%d re-downloads) and %d 304s; %d temporary files left by kills, all removed by the next start", full200.Load(), full200.Load()-int64(n), notMod.Load(), leftovers)
	if lost != 0 || corrupt != 0 || extra != 0 || partial != 0 || temps != 0 || q.dlq != 0 {
		t.Errorf("lost %d, corrupt %d, extra %d, partial %d, temporary %d, dead letters %d; want all 0", lost, corrupt, extra, partial, temps, q.dlq)
	}
}

func publishSoak(t *testing.T, natsURL, base string, n int, sums []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{KeepExisting: true}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		raw := fmt.Sprintf(`{"url":"%s/o/%d","target":%q,"size":%d,"sha256":%q}`, base, i, soakKey(i), soakSize(i), sums[i])
		j, err := jobs.Parse([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync(j.Subject(), []byte(raw), jetstream.WithMsgID(j.ID)); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 || i == n-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publish acks did not arrive")
			}
		}
	}
}

// soakCheckSizes returns how many visible objects do not have their full
// length, and fails on any file that is not an object of the run.
func soakCheckSizes(t *testing.T, root string, n int) int {
	t.Helper()
	bad := 0
	for _, key := range mirrorFilesNames(t, root) {
		var d, i int
		if _, err := fmt.Sscanf(key, "soak/%02d/%05d.bin", &d, &i); err != nil || i < 0 || i >= n || key != soakKey(i) {
			t.Errorf("unexpected file in the mirror: %s", key)
			continue
		}
		fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(key)))
		if err != nil || fi.Size() != int64(soakSize(i)) {
			t.Errorf("partial object at a final path: %s (%v)", key, err)
			bad++
		}
	}
	return bad
}

// mirrorFilesNames lists the keys outside .mirrorworker/ without reading them.
func mirrorFilesNames(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel == mirror.ReservedDir {
				return filepath.SkipDir
			}
			return nil
		}
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func soakTemps(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func soakQueue(t *testing.T, natsURL string) queueState {
	t.Helper()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	q, err := readQueue(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func soakWaitDrained(t *testing.T, natsURL, root string, n int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		q := soakQueue(t, natsURL)
		if q.pending == 0 && q.ackPending == 0 && len(mirrorFilesNames(t, root)) >= n-int(q.dlq) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained after %s: queue %+v, %d files", limit, q, len(mirrorFilesNames(t, root)))
		}
		time.Sleep(time.Second)
	}
}
