package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
)

// Tombstone is what a target remembers of a key that a delete job removed:
// which job, when it was enqueued (the order of the key's fetches and
// deletes, see Supersedes) and what was removed. It outlives the object,
// so that a fetch enqueued before the delete but finished after it is not
// stored (no resurrection), verify does not report the key as missing, and
// an operator can trace the removal to its job
// (docs/adr/0033-deletes-ordered-by-enqueue-time-and-tombstones.md).
type Tombstone struct {
	Key   string `json:"key"`
	URL   string `json:"url"` // without userinfo
	JobID string `json:"job_id"`
	// Enqueued is when the delete job was stored in the job stream.
	Enqueued  time.Time `json:"enqueued"`
	DeletedAt time.Time `json:"deleted_at"`
	// SHA256 and Size are the removed object's, when one was stored with
	// metadata ("" and 0 when the key held nothing).
	SHA256 string `json:"sha256,omitempty"`
	Size   int64  `json:"size,omitempty"`
}

// TombstoneDir is the directory under ReservedDir that holds tombstones:
// <root>/.mirrorworker/tombstones/<key>.json in a file target, the object
// <prefix>.mirrorworker/tombstones/<key> in a bucket.
const TombstoneDir = "tombstones"

// Supersedes reports whether a job enqueued at later is known to come
// after one enqueued at earlier, so that the earlier one must not undo it.
// An unknown instant (zero: metadata of an earlier version, a delivery
// that is not from the stream) supersedes nothing and is superseded by
// nothing, so that such jobs behave as before: the last to run wins.
func Supersedes(later, earlier time.Time) bool {
	return !later.IsZero() && !earlier.IsZero() && later.After(earlier)
}

// EncodeTombstone and DecodeTombstone are the one JSON form of a tombstone,
// in a file target and a bucket alike.
func EncodeTombstone(ts Tombstone) ([]byte, error) {
	ts.URL = authority.StripUserinfo(ts.URL)
	b, err := json.MarshalIndent(ts, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode tombstone: %w", err)
	}
	return append(b, '\n'), nil
}

// DecodeTombstone reads a tombstone written by EncodeTombstone.
func DecodeTombstone(data []byte) (Tombstone, error) {
	var ts Tombstone
	if err := json.Unmarshal(data, &ts); err != nil {
		return Tombstone{}, fmt.Errorf("decode tombstone: %w", err)
	}
	if ts.Key == "" {
		return Tombstone{}, errors.New("decode tombstone: no key")
	}
	return ts, nil
}

func (t *FileTarget) tombDir() string { return filepath.Join(t.root, ReservedDir, TombstoneDir) }

func (t *FileTarget) tombPath(key string) string {
	return filepath.Join(t.tombDir(), filepath.FromSlash(key)+".json")
}

// Delete removes the object under key and its metadata and leaves ts as
// its tombstone, durably: the tombstone is in place (synced) before the
// object goes, so that a crash between the two leaves a tombstone that
// Supersedes the object, never a key that a late fetch could bring back.
// A key with nothing stored gets its tombstone all the same. ts.Key,
// SHA256 and Size are filled in here.
func (t *FileTarget) Delete(ctx context.Context, key string, ts Tombstone) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ts.Key = key
	if m, err := t.Stat(ctx, key); err == nil {
		ts.SHA256, ts.Size = m.SHA256, m.Size
	}
	data, err := EncodeTombstone(ts)
	if err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	tmp, err := t.writeTempBytes("tomb-", data)
	if err != nil {
		return fmt.Errorf("delete %q: write tombstone: %w", key, err)
	}
	defer func() {
		if tmp != nil {
			tmp.abort()
		}
	}()
	p := t.tombPath(key)
	if err := t.mkdirs(filepath.Join(t.root, ReservedDir), filepath.Dir(p)); err != nil {
		return fmt.Errorf("delete %q: tombstone: %w", key, err)
	}
	mu := &t.keyMu[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	if err := rename(tmp.name, p); err != nil {
		return fmt.Errorf("delete %q: tombstone: %w", key, err)
	}
	err = tmp.close()
	tmp = nil
	if err != nil {
		return fmt.Errorf("delete %q: tombstone: %w", key, err)
	}
	if err := t.dirSyncs.sync(filepath.Dir(p)); err != nil {
		return fmt.Errorf("delete %q: tombstone: %w", key, err)
	}
	if err := t.removeLocked(key); err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	return nil
}

// Tombstone returns the tombstone of key, or ErrNotFound when it has none.
func (t *FileTarget) Tombstone(ctx context.Context, key string) (Tombstone, error) {
	if err := ValidateKey(key); err != nil {
		return Tombstone{}, err
	}
	if err := ctx.Err(); err != nil {
		return Tombstone{}, err
	}
	data, err := os.ReadFile(t.tombPath(key))
	switch {
	case err != nil && (errors.Is(err, fs.ErrNotExist) || isNotDir(err)):
		return Tombstone{}, fmt.Errorf("tombstone %q: %w", key, ErrNotFound)
	case err != nil:
		return Tombstone{}, fmt.Errorf("tombstone %q: %w", key, err)
	}
	ts, err := DecodeTombstone(data)
	if err != nil {
		return Tombstone{}, fmt.Errorf("tombstone %q: %w", key, err)
	}
	return ts, nil
}

// ClearTombstone removes key's tombstone, durably, if there is one: a
// fetch enqueued after the delete stored the key again.
func (t *FileTarget) ClearTombstone(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	mu := &t.keyMu[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	if err := t.removeSidecar(t.tombPath(key), false); err != nil {
		return fmt.Errorf("clear tombstone %q: %w", key, err)
	}
	return nil
}

// ListTombstones calls fn with every tombstone of the target, in lexical
// order of the keys; fn's error stops the walk and is returned. A file that
// cannot be read as a tombstone is skipped.
func (t *FileTarget) ListTombstones(ctx context.Context, fn func(Tombstone) error) error {
	dir := t.tombDir()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".json") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil // removed since the walk saw it
		}
		ts, err := DecodeTombstone(data)
		if err != nil {
			return nil
		}
		return fn(ts)
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no delete yet
	}
	return err
}
