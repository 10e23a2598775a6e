package sumindex

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/mirrorworker/mirrorworker/mirror"
)

// FileName is the file target's index, under its reserved directory:
// <root>/.mirrorworker/sha256.db.
const FileName = "sha256.db"

// DefaultLockWait is how long OpenBolt waits for another process to let
// go of the file (a second pod on the same volume, verify beside a
// worker) before it gives up with ErrHeld.
const DefaultLockWait = 2 * time.Second

// ErrHeld: another process has the index file open. Only one process at a
// time keeps a file target's index; the others store every job by fetching
// it, as without an index.
var ErrHeld = errors.New("sumindex: the index is held by another process")

var bucketName = []byte("sha256")

// Bolt is an Index in a bbolt file: one B+tree keyed by the 32 raw bytes
// of the digest, whose value is the key. The file is opened for one
// process at a time (bbolt locks it with flock(2)). Lookups read the
// memory-mapped file without a lock. An Add returns before its entry is
// committed: its committer takes the Adds of up to CommitDelay into one
// transaction (one commit, with its fsyncs), and Lookup sees an entry
// from its Add on. An entry is a hint, so a crash that loses the last
// CommitDelay of them costs a later fetch each (ADR 0034), no more.
// Forget, Replace, Len and Close first commit the Adds before them, so an
// older Add is never committed over a newer change. Safe for concurrent
// use.
type Bolt struct {
	db *bolt.DB

	flushes chan chan error // to the committer: commit now, and say how it went
	kick    chan struct{}   // to the committer: an Add is waiting (buffered, 1)
	stop    chan struct{}   // closed by Close
	stopped chan struct{}   // closed by the committer when it ends

	mu      sync.Mutex        // guards the fields below
	queue   []Entry           // the Adds not yet taken by a commit, in order, sums raw
	pending map[string]string // raw sum -> key of its newest Add not yet committed
	failed  error             // the first commit that failed since the last flush
}

// CommitDelay is how long the Adds wait to share a commit (bbolt's own
// Batch waited 10 ms, and the Put that asked waited with it): about 100
// entries a commit at 1,000 Puts a second. A crash loses at most the
// entries of the last CommitDelay and the commit under way.
const CommitDelay = 100 * time.Millisecond

// maxQueued is how many Adds may wait for their commit: past it, an Add
// commits them itself (a fill of a million entries stays bounded).
const maxQueued = 4096

var _ Index = (*Bolt)(nil)

// BoltPath is where a file target rooted at root keeps its index.
func BoltPath(root string) string { return filepath.Join(root, mirror.ReservedDir, FileName) }

// OpenBolt opens (or creates) the index file at path, waiting up to wait
// (DefaultLockWait if 0) for a process that holds it; then it returns
// ErrHeld.
func OpenBolt(path string, wait time.Duration) (*Bolt, error) {
	if wait <= 0 {
		wait = DefaultLockWait
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("open sha256 index: %w", err)
	}
	db, err := bolt.Open(path, 0o644, &bolt.Options{
		Timeout: wait,
		// The freelist is rebuilt from the pages at open instead of being
		// written at every commit: cheaper commits, a slower open (a scan
		// of the file, ~0.1 s per million entries).
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("open sha256 index %s: %w", path, ErrHeld)
	}
	if err != nil {
		return nil, fmt.Errorf("open sha256 index %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketName)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sha256 index %s: %w", path, err)
	}
	b := &Bolt{
		db:      db,
		flushes: make(chan chan error),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
		pending: map[string]string{},
	}
	go b.commitLoop()
	return b, nil
}

// Close commits the Adds still waiting, closes the file and lets another
// process open it. It returns the first failed commit since the last
// flush, if any.
func (b *Bolt) Close() error {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.stopped
	ferr := b.flush()
	if err := b.db.Close(); err != nil {
		return err
	}
	return ferr
}

// commitLoop commits the waiting Adds CommitDelay after the first of
// them, or at once when asked (flushes), until Close.
func (b *Bolt) commitLoop() {
	defer close(b.stopped)
	for {
		select {
		case <-b.stop:
			return
		case done := <-b.flushes:
			done <- b.flush()
			continue
		case <-b.kick:
		}
		t := time.NewTimer(CommitDelay)
		select {
		case <-b.stop:
			t.Stop()
			return // Close commits them
		case done := <-b.flushes:
			t.Stop()
			done <- b.flush()
		case <-t.C:
			if err := b.commit(); err != nil {
				b.mu.Lock()
				if b.failed == nil {
					b.failed = err
				}
				b.mu.Unlock()
			}
		}
	}
}

// sync has the committer commit the waiting Adds now, and returns the
// first failure since the last one reported. After Close it commits them
// itself.
func (b *Bolt) sync() error {
	done := make(chan error, 1)
	select {
	case b.flushes <- done:
		return <-done
	case <-b.stopped:
		return b.flush()
	}
}

// flush commits the waiting Adds and returns that commit's error or an
// earlier one not yet reported. Only the committer, or anyone once it has
// stopped, calls it: commits stay in the order of their Adds.
func (b *Bolt) flush() error {
	err := b.commit()
	b.mu.Lock()
	if b.failed != nil {
		err = cmp.Or(b.failed, err)
		b.failed = nil
	}
	b.mu.Unlock()
	return err
}

// commit writes the waiting Adds in one transaction. Their entries leave
// pending once they are committed (or lost, on error: a hint fewer).
func (b *Bolt) commit() error {
	b.mu.Lock()
	q := b.queue
	b.queue = nil
	b.mu.Unlock()
	if len(q) == 0 {
		return nil
	}
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketName)
		for _, e := range q {
			if err := bk.Put([]byte(e.Sum), []byte(e.Key)); err != nil {
				return err
			}
		}
		return nil
	})
	b.mu.Lock()
	for _, e := range q {
		if b.pending[e.Sum] == e.Key {
			delete(b.pending, e.Sum)
		}
	}
	b.mu.Unlock()
	if err != nil {
		return fmt.Errorf("commit %d sha256 entries: %w", len(q), err)
	}
	return nil
}

// Path returns the index file's path.
func (b *Bolt) Path() string { return b.db.Path() }

func rawSum(sum string) ([]byte, error) {
	if !ValidSum(sum) {
		return nil, fmt.Errorf("sumindex: %q is not a sha256", sum)
	}
	return hex.DecodeString(sum)
}

// Lookup returns the key recorded for sum.
func (b *Bolt) Lookup(ctx context.Context, sum string) (string, error) {
	k, err := rawSum(sum)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	key, ok := b.pending[string(k)]
	b.mu.Unlock()
	if ok {
		return key, nil
	}
	err = b.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketName).Get(k); v != nil {
			key = string(v) // v is valid only inside the transaction
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", sum, err)
	}
	if key == "" {
		return "", fmt.Errorf("look up %s: %w", sum, mirror.ErrNotFound)
	}
	return key, nil
}

// Add records key for sum: Lookup sees it at once, and the committer
// makes it durable within about CommitDelay. A failed commit is reported
// by the next Forget, Replace, Len or Close, not here.
func (b *Bolt) Add(ctx context.Context, sum, key string) error {
	k, err := rawSum(sum)
	if err != nil {
		return err
	}
	select {
	case <-b.stop:
		return fmt.Errorf("add %s: %w", sum, bolterrors.ErrDatabaseNotOpen)
	default:
	}
	b.mu.Lock()
	b.pending[string(k)] = key
	b.queue = append(b.queue, Entry{Sum: string(k), Key: key})
	n := len(b.queue)
	b.mu.Unlock()
	if n >= maxQueued {
		if err := b.sync(); err != nil {
			return fmt.Errorf("add %s: %w", sum, err)
		}
		return nil
	}
	select {
	case b.kick <- struct{}{}:
	default: // the committer has been told already
	}
	return nil
}

// Forget removes sum's entry if it names key.
func (b *Bolt) Forget(ctx context.Context, sum, key string) error {
	k, err := rawSum(sum)
	if err != nil {
		return err
	}
	// An Add before this Forget is committed first, or it would bring
	// the entry back after it.
	if err := b.sync(); err != nil {
		return fmt.Errorf("forget %s: %w", sum, err)
	}
	if err := b.db.Batch(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketName)
		if string(bk.Get(k)) != key {
			return nil
		}
		return bk.Delete(k)
	}); err != nil {
		return fmt.Errorf("forget %s: %w", sum, err)
	}
	return nil
}

// Entry is one digest and the key recorded for it.
type Entry struct{ Sum, Key string }

// Replace makes the index hold exactly entries, in one transaction (a
// rebuild by verify): the old entries are dropped. It returns how many
// entries were added that were not there, how many were dropped, and how
// many named another key before.
func (b *Bolt) Replace(ctx context.Context, entries []Entry) (added, dropped, changed int, err error) {
	want := make(map[string]string, len(entries))
	for _, e := range entries {
		k, err := rawSum(e.Sum)
		if err != nil {
			return 0, 0, 0, err
		}
		want[string(k)] = e.Key
	}
	if err := b.sync(); err != nil {
		return 0, 0, 0, fmt.Errorf("rebuild sha256 index: %w", err)
	}
	err = b.db.Update(func(tx *bolt.Tx) error {
		old := tx.Bucket(bucketName)
		before := make(map[string]string, old.Stats().KeyN)
		if err := old.ForEach(func(k, v []byte) error {
			before[string(k)] = string(v)
			return nil
		}); err != nil {
			return err
		}
		if err := tx.DeleteBucket(bucketName); err != nil {
			return err
		}
		bk, err := tx.CreateBucket(bucketName)
		if err != nil {
			return err
		}
		// In key order, with full pages: bbolt appends instead of
		// splitting, and the rebuilt file is as small as it gets.
		bk.FillPercent = 1
		keys := make([]string, 0, len(want))
		for k := range want {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := want[k]
			if err := bk.Put([]byte(k), []byte(v)); err != nil {
				return err
			}
			switch prev, ok := before[k]; {
			case !ok:
				added++
			case prev != v:
				changed++
			}
		}
		for k := range before {
			if _, ok := want[k]; !ok {
				dropped++
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("rebuild sha256 index: %w", err)
	}
	return added, dropped, changed, nil
}

// Len returns the number of entries.
func (b *Bolt) Len() (int, error) {
	if err := b.sync(); err != nil {
		return 0, err
	}
	var n int
	err := b.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketName).Stats().KeyN
		return nil
	})
	return n, err
}
