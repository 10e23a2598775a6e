package mirror

import (
	"fmt"
	"io/fs"
	"sync"
	"syscall"
)

// dirSyncs coalesces the fsyncs of one directory across concurrent Puts
// (group commit): a Put whose rename is done joins the next fsync of its
// directory that has not started yet, and one fsync makes every rename
// that joined it durable. A Put never relies on an fsync that was already
// running when it joined, since that one may have missed its rename.
//
// The zero value is ready; it is safe for concurrent use. A directory's
// entry lives only while a Put waits on it, so the map stays as small as
// the number of Puts in flight.
type dirSyncs struct {
	// fsync makes a directory's entries durable: syncDir, or a test's
	// stand-in. Set before first use.
	fsync func(dir string) error
	// whole, when set (Options.SyncFilesystem), makes every change to the
	// target's file system durable (syncfs of the root, or a test's
	// stand-in); then every sync, whatever its directory, joins the next
	// call of it (all), and an object's bytes wait for it too (syncObject).
	// Set before first use.
	whole func() error
	all   dirSync

	mu   sync.Mutex
	dirs map[string]*dirSync
}

// dirSync is one directory's fsync state (or, with dirSyncs.whole, the
// file system's). The zero value is ready.
type dirSync struct {
	refs int // guarded by dirSyncs.mu

	mu      sync.Mutex
	cond    sync.Cond // signalled when an fsync ends
	running bool      // an fsync is under way
	next    *syncBatch
	waiters int // callers waiting on cond
}

// syncBatch is one fsync and the Puts that joined it.
type syncBatch struct {
	done bool
	err  error
}

// sync makes the entries of dir durable: on return with nil, every change
// to dir made before the call is on stable storage.
func (s *dirSyncs) sync(dir string) error {
	if s.whole != nil {
		return s.all.sync(s.whole)
	}
	s.mu.Lock()
	d := s.dirs[dir]
	if d == nil {
		if s.dirs == nil {
			s.dirs = make(map[string]*dirSync)
		}
		d = &dirSync{}
		s.dirs[dir] = d
	}
	d.refs++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if d.refs--; d.refs == 0 {
			delete(s.dirs, dir)
		}
		s.mu.Unlock()
	}()
	fsync := s.fsync
	if fsync == nil {
		fsync = syncDir
	}
	return d.sync(func() error { return fsync(dir) })
}

func (d *dirSync) sync(fsync func() error) error {
	d.mu.Lock()
	if d.cond.L == nil {
		d.cond.L = &d.mu
	}
	if d.next == nil {
		d.next = &syncBatch{}
	}
	b := d.next
	for {
		if b.done {
			d.mu.Unlock()
			return b.err
		}
		if !d.running {
			break
		}
		d.waiters++
		d.cond.Wait()
		d.waiters--
	}
	// b has not started, and nothing runs: this caller runs it for all
	// who joined (and closes it to later ones).
	d.running, d.next = true, nil
	d.mu.Unlock()
	err := fsync()
	d.mu.Lock()
	b.done, b.err, d.running = true, err, false
	d.cond.Broadcast()
	d.mu.Unlock()
	return err
}

// syncDir makes the entries of dir durable. It uses the system calls
// directly: os.Open would also try to register the descriptor with the
// poller and switch it to non-blocking and back (five extra calls).
func syncDir(dir string) error {
	fd, err := openRetry(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	if err := fsyncRetry(fd); err != nil {
		syscall.Close(fd)
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	if err := syscall.Close(fd); err != nil {
		return &fs.PathError{Op: "close", Path: dir, Err: err}
	}
	return nil
}
