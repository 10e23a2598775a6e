package mirror

import (
	"io/fs"
	"math/rand/v2"
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
// It is not safe for concurrent use.
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
// (0644, whatever the umask, as objects are published to readers).
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
		// The umask may have narrowed the mode given to open.
		if err := f.op("chmod", func() error { return syscall.Fchmod(fd, 0o644) }); err != nil {
			f.abort()
			return nil, err
		}
		return f, nil
	}
	return nil, &fs.PathError{Op: "createtemp", Path: filepath.Join(dir, prefix+"*"), Err: fs.ErrExist}
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

func (f *tempFile) close() error {
	err := syscall.Close(f.fd)
	f.fd = -1
	if err != nil {
		return &fs.PathError{Op: "close", Path: f.name, Err: err}
	}
	return nil
}

// abort closes the file if open and removes it.
func (f *tempFile) abort() {
	if f.fd >= 0 {
		syscall.Close(f.fd)
		f.fd = -1
	}
	syscall.Unlink(f.name)
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
