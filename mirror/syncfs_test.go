//go:build linux

package mirror

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSyncFilesystemOrdersAPut: with Options.SyncFilesystem, a Put's bytes
// wait for a syncfs that starts after they are written and ends before the
// rename, its rename for one that starts after it and ends before the Put
// returns; and no directory is fsynced on its own.
func TestSyncFilesystemOrdersAPut(t *testing.T) {
	var (
		mu    sync.Mutex
		steps []string
	)
	step := func(s string) { mu.Lock(); steps = append(steps, s); mu.Unlock() }
	ft, err := OpenWith(t.TempDir(), &Options{SyncFilesystem: true, FaultHook: step})
	if err != nil {
		t.Fatal(err)
	}
	ft.dirSyncs.whole = func() error {
		step("syncfs")
		return syncFilesystem(ft.root)
	}
	ft.dirSyncs.fsync = func(dir string) error {
		t.Errorf("directory %s fsynced on its own", dir)
		return syncDir(dir)
	}
	if _, err := ft.Put(context.Background(), "host.example/a/b", strings.NewReader("bytes"), Expect{}, Meta{}); err != nil {
		t.Fatal(err)
	}
	// Each pair of steps must have a syncfs between them (the new
	// directories, host.example and a, wait for syncfs calls of their own).
	got := strings.Join(steps, " ")
	for _, p := range [][2]string{{FaultObjectWritten, FaultObjectSynced}, {FaultObjectRenamed, FaultObjectDirSynced}} {
		from, to := slices.Index(steps, p[0]), slices.Index(steps, p[1])
		if from < 0 || to < from || !slices.Contains(steps[from:to], "syncfs") {
			t.Errorf("steps %q: want a syncfs between %s and %s", got, p[0], p[1])
		}
	}
	if b, err := os.ReadFile(ft.objectPath("host.example/a/b")); err != nil || string(b) != "bytes" {
		t.Errorf("object: %q, %v", b, err)
	}
}

// TestSyncFilesystemIsShared: concurrent Puts share syncfs calls (fewer
// than one per Put, where fsyncs would take two), and each returns only
// after a syncfs that started once its object was in place has ended.
func TestSyncFilesystemIsShared(t *testing.T) {
	ft, err := OpenWith(t.TempDir(), &Options{SyncFilesystem: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	key := func(i int) string { return fmt.Sprintf("host.example/k%d", i) }
	if _, err := ft.Put(context.Background(), key(n), strings.NewReader("first"), Expect{}, Meta{}); err != nil {
		t.Fatal(err) // the directory, made before the count starts
	}
	var (
		calls   atomic.Int64
		covered [n]atomic.Bool // object i was in place when an ended syncfs started
		first   = make(chan struct{})
		release = make(chan struct{})
		once    sync.Once
	)
	defer once.Do(func() { close(release) })
	ft.dirSyncs.whole = func() error {
		var in []int
		for i := range n {
			if _, err := os.Lstat(ft.objectPath(key(i))); err == nil {
				in = append(in, i)
			}
		}
		if calls.Add(1) == 1 {
			close(first)
			<-release // a slow device: every Put arrives while the first syncfs runs
		}
		err := syncFilesystem(ft.root)
		for _, i := range in {
			covered[i].Store(true)
		}
		return err
	}
	errs := make(chan error, n)
	var returned [n]atomic.Bool
	for i := range n {
		go func() {
			_, err := ft.Put(context.Background(), key(i), strings.NewReader(key(i)), Expect{}, Meta{})
			if err == nil && !covered[i].Load() {
				err = fmt.Errorf("Put of %s returned before a syncfs that started with its object in place had ended", key(i))
			}
			returned[i].Store(true)
			errs <- err
		}()
	}
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no syncfs")
	}
	// Let the first syncfs end once every Put waits (none has returned:
	// each needs a syncfs after its rename, and the first one holds).
	deadline := time.Now().Add(30 * time.Second)
	for waiting(&ft.dirSyncs.all) < n-1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d Puts wait for the next syncfs, want %d", waiting(&ft.dirSyncs.all), n-1)
		}
		time.Sleep(time.Millisecond)
	}
	for i := range n {
		if returned[i].Load() {
			t.Errorf("Put %d returned while the only syncfs so far was held", i)
		}
	}
	once.Do(func() { close(release) })
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d syncfs calls for %d Puts", calls.Load(), n)
	if c := calls.Load(); c >= n {
		t.Errorf("%d syncfs calls for %d Puts: not shared", c, n)
	}
	for i := range n {
		if b, err := os.ReadFile(ft.objectPath(key(i))); err != nil || string(b) != key(i) {
			t.Errorf("object %d: %q, %v", i, b, err)
		}
	}
}

// waiting is how many callers wait for d's next sync (a test's probe).
func waiting(d *dirSync) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiters
}
