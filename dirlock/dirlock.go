// Package dirlock provides an advisory lock on a file (flock(2)) that a
// process holds for as long as it uses a directory, and the record of who
// holds it: the pid and the addresses another process needs to join the
// holder instead of competing with it.
//
// The lock is the kernel's: it ends with the process, however the process
// ends (SIGKILL included), so a stale lock file never keeps a directory
// locked; only its record stays behind, and the next holder rewrites it.
// It does not protect a directory from a process that does not take the
// lock, and it is advisory on file systems without flock (some network
// file systems emulate it with byte-range locks, which still exclude).
package dirlock

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Holder is what a lock file records of the process that holds it.
type Holder struct {
	PID int `json:"pid"`
	// NATSURL is the client URL of the holder's embedded NATS server
	// ("" until it listens, or when it listens in-process only).
	NATSURL string `json:"nats_url,omitempty"`
	// AdminURL is the holder's admin endpoint ("" until it listens).
	AdminURL string `json:"admin_url,omitempty"`
}

// HeldError is returned by Exclusive when another process holds the lock.
// Holder is what its lock file says (the zero Holder when it could not be
// read: the holder has not written it yet).
type HeldError struct {
	Path   string
	Holder Holder
}

func (e *HeldError) Error() string {
	if e.Holder.PID == 0 {
		return fmt.Sprintf("%s is locked by another process", e.Path)
	}
	return fmt.Sprintf("%s is locked by pid %d", e.Path, e.Holder.PID)
}

// Lock is a held lock on one file. It is safe for concurrent use.
type Lock struct {
	f *os.File
}

// Exclusive takes the exclusive lock on path (creating the file) without
// waiting, and records h in it. When another process holds the lock it
// returns a *HeldError naming that process.
func Exclusive(path string, h Holder) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			held, _ := Read(path)
			return nil, &HeldError{Path: path, Holder: held}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	l := &Lock{f: f}
	if err := l.Record(h); err != nil {
		l.Release()
		return nil, err
	}
	return l, nil
}

// Record rewrites the lock file's record (the holder's addresses once it
// listens). A reader may see it empty for a moment; Read then reports
// the zero Holder. A nil Lock records nothing.
func (l *Lock) Record(h Holder) error {
	if l == nil {
		return nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("lock %s: record: %w", l.f.Name(), err)
	}
	if _, err := l.f.WriteAt(append(b, '\n'), 0); err != nil {
		return fmt.Errorf("lock %s: record: %w", l.f.Name(), err)
	}
	return nil
}

// Release ends the lock. The file stays: removing it would let a process
// that opened it just before lock a file no longer in the directory while
// a third locks a new one. A nil Lock releases nothing.
func (l *Lock) Release() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}

// Held reports whether a process holds the lock on path, and the holder
// its file records, without taking the lock or writing the file (a
// client asking after a worker). A missing file is not held.
func Held(path string) (Holder, bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Holder{}, false, nil
	}
	if err != nil {
		return Holder{}, false, err
	}
	defer f.Close()
	switch err := flock(f, syscall.LOCK_SH|syscall.LOCK_NB); {
	case err == nil:
		return Holder{}, false, nil // closing the file lets go of it
	case errors.Is(err, syscall.EWOULDBLOCK):
		h, _ := Read(path)
		return h, true, nil
	default:
		return Holder{}, false, fmt.Errorf("lock %s: %w", path, err)
	}
}

// Read returns the holder recorded in the lock file at path.
func Read(path string) (Holder, error) {
	var h Holder
	b, err := os.ReadFile(path)
	if err != nil {
		return h, err
	}
	if len(b) == 0 {
		return h, nil
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return Holder{}, fmt.Errorf("lock file %s: %w", path, err)
	}
	return h, nil
}

// flock is flock(2), retried when a signal interrupts it.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
