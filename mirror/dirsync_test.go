package mirror

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestDirSyncCoversEveryEarlierChange: whatever the interleaving, a caller
// returns only after an fsync that started after its call (its rename) has
// ended, and fsyncs are shared.
func TestDirSyncCoversEveryEarlierChange(t *testing.T) {
	var (
		d       dirSync
		changes atomic.Int64 // renames done so far
		covered atomic.Int64 // renames an ended fsync covers
		fsyncs  atomic.Int64
	)
	d.cond.L = &d.mu
	fsync := func() error {
		fsyncs.Add(1)
		upTo := changes.Load()
		time.Sleep(200 * time.Microsecond) // a disk's flush
		for {
			c := covered.Load()
			if c >= upTo || covered.CompareAndSwap(c, upTo) {
				return nil
			}
		}
	}
	const callers, rounds = 16, 50
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range rounds {
				mine := changes.Add(1)
				if err := d.sync(fsync); err != nil {
					t.Error(err)
					return
				}
				if c := covered.Load(); c < mine {
					t.Errorf("returned after fsyncs covering %d changes, but change %d was made before the call", c, mine)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d fsyncs for %d calls", fsyncs.Load(), callers*rounds)
	if n := fsyncs.Load(); n >= callers*rounds {
		t.Errorf("%d fsyncs for %d calls: none was shared", n, callers*rounds)
	}
}

// TestDirSyncSharesTheError: every caller covered by a failed fsync gets
// its error, never a success; the next fsync is tried afresh.
func TestDirSyncSharesTheError(t *testing.T) {
	var d dirSync
	d.cond.L = &d.mu
	errDisk := errors.New("EIO")
	var fail atomic.Bool
	fail.Store(true)
	var fsyncs atomic.Int64
	fsync := func() error {
		fsyncs.Add(1)
		time.Sleep(time.Millisecond)
		if fail.Load() {
			return errDisk
		}
		return nil
	}
	const callers = 8
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			if err := d.sync(fsync); !errors.Is(err, errDisk) {
				t.Errorf("a caller during failing fsyncs got %v", err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d failing fsyncs for %d callers", fsyncs.Load(), callers)
	fail.Store(false)
	if err := d.sync(fsync); err != nil {
		t.Errorf("after the failure, a new fsync: %v", err)
	}
}

// TestNewDirectoriesShareTheirParentsFsync: Puts that each create a
// directory under one parent (a new authority each) make their
// directories at once and share fsyncs of the parent; none waits for
// another's fsync to make its own directory, and each returns only after
// an fsync of the parent that started once its directory existed.
func TestNewDirectoriesShareTheirParentsFsync(t *testing.T) {
	root := t.TempDir()
	ft, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var fsyncs atomic.Int64
	var synced [n]atomic.Bool // directory i existed when an fsync of root started
	started, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	ft.dirSyncs.fsync = func(dir string) error {
		if dir == root {
			for i := range n {
				if _, err := os.Lstat(filepath.Join(root, fmt.Sprintf("a%d", i))); err == nil {
					synced[i].Store(true)
				}
			}
		}
		if fsyncs.Add(1) == 1 {
			close(started)
			<-release // a slow disk: the first fsync lasts until every directory exists
		}
		return syncDir(dir)
	}
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- ft.mkdirs(root, filepath.Join(root, fmt.Sprintf("a%d", i))) }()
	}
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no fsync of the parent through dirSyncs")
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < n; {
		if _, err := os.Lstat(filepath.Join(root, fmt.Sprintf("a%d", i))); err == nil {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("directory a%d not made while the first fsync of the parent was under way: creators take turns", i)
		}
		runtime.Gosched()
	}
	releaseOnce.Do(func() { close(release) })
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if !synced[i].Load() {
			t.Errorf("mkdirs of a%d returned before an fsync of the parent that started after it existed", i)
		}
	}
	if got := fsyncs.Load(); got >= n {
		t.Errorf("%d fsyncs for %d new directories under one parent, want them shared", got, n)
	}
}
