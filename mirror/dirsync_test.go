package mirror

import (
	"errors"
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
