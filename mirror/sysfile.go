package mirror

import (
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// The target's own files (temporary objects, directories to sync) are
// handled through file descriptors rather than *os.File: os.OpenFile tries
// to register a regular file with the network poller and toggles
// O_NONBLOCK around it, five system calls per file that a store paying
// for fsyncs can skip. Every error is an *fs.PathError, as os would return.

// tempFile is a file being written under the reserved tmp directory.
// Its descriptor holds an exclusive flock(2) on it from creation until it
// is renamed into place or removed and then closed, so the start-up sweep
// of another process sharing the root (sweepTemps) leaves it alone; the
// kernel drops the lock when the process dies, so a crash's leftovers are
// swept. It is not safe for concurrent use.
type tempFile struct {
	fd   int
	name string

	written int64 // bytes written
	flushed int64 // bytes whose writeback has been started
}

// writebackChunk is how many bytes a tempFile lets pile up in the page
// cache before it starts their writeback (startWriteback).
const writebackChunk = 8 << 20

// createTemp creates a new file prefix-NNNN in dir, readable by all
// (0644, whatever the umask, as objects are published to readers), and
// locks it (see tempFile).
func createTemp(dir, prefix string) (*tempFile, error) {
	for range 10000 {
		name := filepath.Join(dir, prefix+strconv.FormatUint(uint64(rand.Uint32()), 10))
		fd, err := openRetry(name, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o644)
		if err == syscall.EEXIST {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		f := &tempFile{fd: fd, name: name}
		// The file exists unlocked between open and flock: a sweep may
		// lock it first (then our flock fails) or lock and unlink it
		// before we lock (then it has no link left). Either way it is
		// the sweep's; take another name.
		ok, mode, err := f.lock()
		switch {
		case err != nil:
			f.abort()
			return nil, err
		case !ok:
			syscall.Close(fd)
			continue
		}
		// The umask may have narrowed the mode given to open. The lock's
		// fstat has read the mode already: with the usual umask (022)
		// it is 0644 and the chmod, a journalled inode update per
		// object, is skipped.
		if mode != 0o644 {
			if err := f.op("chmod", func() error { return syscall.Fchmod(fd, 0o644) }); err != nil {
				f.abort()
				return nil, err
			}
		}
		return f, nil
	}
	return nil, &fs.PathError{Op: "createtemp", Path: filepath.Join(dir, prefix+"*"), Err: fs.ErrExist}
}

// lock takes the exclusive lock on the new file without waiting. It
// reports false when a sweep holds the lock or has already unlinked the
// file, and the file's permission bits as its fstat read them (mode is
// 0, which no file is created with here, when it did not fstat). On a
// file system without flock it goes on unlocked (the sweep there cannot
// tell live files from dead ones, see lockedForSweep).
func (f *tempFile) lock() (ok bool, mode uint32, err error) {
	switch err := flockRetry(f.fd, syscall.LOCK_EX|syscall.LOCK_NB); {
	case err == syscall.EWOULDBLOCK:
		return false, 0, nil
	case err != nil && noLocks(err):
		return true, 0, nil
	case err != nil:
		return false, 0, &fs.PathError{Op: "flock", Path: f.name, Err: err}
	}
	var st syscall.Stat_t
	if err := f.op("fstat", func() error { return syscall.Fstat(f.fd, &st) }); err != nil {
		return false, 0, err
	}
	return st.Nlink > 0, st.Mode & 0o7777, nil
}

func (f *tempFile) op(name string, call func() error) error {
	for {
		err := call()
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &fs.PathError{Op: name, Path: f.name, Err: err}
		}
		return nil
	}
}

// Write writes all of p (io.Writer).
func (f *tempFile) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := syscall.Write(f.fd, p[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, &fs.PathError{Op: "write", Path: f.name, Err: err}
		}
		n += m
	}
	f.written += int64(n)
	if f.written-f.flushed >= writebackChunk {
		startWriteback(f.fd, f.flushed, f.written-f.flushed)
		f.flushed = f.written
	}
	return n, nil
}

func (f *tempFile) sync() error { return f.op("sync", func() error { return syscall.Fsync(f.fd) }) }

// close closes the file, which releases its lock: only once it is
// renamed into place or removed.
func (f *tempFile) close() error {
	err := syscall.Close(f.fd)
	f.fd = -1
	if err != nil {
		return &fs.PathError{Op: "close", Path: f.name, Err: err}
	}
	return nil
}

// abort removes the file and closes it if open (in that order, so the
// lock covers the unlink).
func (f *tempFile) abort() {
	syscall.Unlink(f.name)
	if f.fd >= 0 {
		syscall.Close(f.fd)
		f.fd = -1
	}
}

// remove is abort that reports the unlink's error.
func (f *tempFile) remove() error {
	err := syscall.Unlink(f.name)
	f.abort()
	if err != nil {
		return &fs.PathError{Op: "unlink", Path: f.name, Err: err}
	}
	return nil
}

// sweepTemps removes the temporary files under dir that no live writer
// holds: those a killed process left (its locks died with it) and
// anything that is not a regular file (no writer makes one). A file
// another process is writing is locked and stays. It returns how many it
// removed and how many it left to their writers.
func sweepTemps(dir string) (removed, live int, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() {
			if err := os.RemoveAll(p); err != nil {
				return removed, live, err
			}
			removed++
			continue
		}
		switch ok, err := sweepFile(p); {
		case err != nil:
			return removed, live, err
		case ok:
			removed++
		default:
			live++
		}
	}
	return removed, live, nil
}

// sweepFile removes the regular file p if it can lock it without
// waiting, and reports whether it did. The unlink happens under the lock
// and only if p still names the locked file, so a writer that loses the
// race for its new file sees it unlinked (tempFile.lock) and a writer's
// file is never removed by a sweep that locked another.
func sweepFile(p string) (bool, error) {
	// O_RDWR: where flock is emulated with byte-range locks (NFS), an
	// exclusive lock needs a descriptor open for writing.
	fd, err := openRetry(p, syscall.O_RDWR|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err == syscall.EACCES {
		fd, err = openRetry(p, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	}
	switch {
	case err == syscall.ENOENT:
		return false, nil // renamed into place or removed by its writer
	case err != nil:
		return false, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer syscall.Close(fd)
	switch err := flockRetry(fd, syscall.LOCK_EX|syscall.LOCK_NB); {
	case err == syscall.EWOULDBLOCK:
		return false, nil
	case err != nil && !noLocks(err):
		return false, &fs.PathError{Op: "flock", Path: p, Err: err}
	}
	var held, named syscall.Stat_t
	if err := syscall.Fstat(fd, &held); err != nil {
		return false, &fs.PathError{Op: "fstat", Path: p, Err: err}
	}
	switch err := syscall.Lstat(p, &named); {
	case err == syscall.ENOENT:
		return false, nil
	case err != nil:
		return false, &fs.PathError{Op: "lstat", Path: p, Err: err}
	case named.Dev != held.Dev || named.Ino != held.Ino:
		return false, nil
	}
	if err := syscall.Unlink(p); err != nil && err != syscall.ENOENT {
		return false, &fs.PathError{Op: "unlink", Path: p, Err: err}
	}
	return true, nil
}

// noLocks reports a file system that does not implement flock.
func noLocks(err error) bool {
	return err == syscall.ENOLCK || err == syscall.EOPNOTSUPP || err == syscall.ENOSYS || err == syscall.EINVAL
}

func flockRetry(fd, how int) error {
	for {
		if err := syscall.Flock(fd, how); err != syscall.EINTR {
			return err
		}
	}
}

func openRetry(path string, flag int, perm uint32) (int, error) {
	for {
		fd, err := syscall.Open(path, flag, perm)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}

func fsyncRetry(fd int) error {
	for {
		if err := syscall.Fsync(fd); err != syscall.EINTR {
			return err
		}
	}
}
