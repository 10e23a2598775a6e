package sumindex

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
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
// memory-mapped file without a lock; Adds from concurrent Puts are batched
// into one transaction (one fsync) by bbolt's Batch. Safe for concurrent
// use.
type Bolt struct {
	db *bolt.DB
}

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
	return &Bolt{db: db}, nil
}

// Close closes the file and lets another process open it.
func (b *Bolt) Close() error { return b.db.Close() }

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
	var key string
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

// Add records key for sum. Concurrent Adds share one commit.
func (b *Bolt) Add(ctx context.Context, sum, key string) error {
	k, err := rawSum(sum)
	if err != nil {
		return err
	}
	if err := b.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketName).Put(k, []byte(key))
	}); err != nil {
		return fmt.Errorf("add %s: %w", sum, err)
	}
	return nil
}

// Forget removes sum's entry if it names key.
func (b *Bolt) Forget(ctx context.Context, sum, key string) error {
	k, err := rawSum(sum)
	if err != nil {
		return err
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
	var n int
	err := b.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketName).Stats().KeyN
		return nil
	})
	return n, err
}
