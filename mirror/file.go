package mirror

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/mirrorworker/mirrorworker/authority"
)

// ErrKeyConflict: the key needs a directory where an object is stored, or
// names a directory that holds other objects (keys "a" and "a/b"). Nothing
// was stored. It is permanent for the job.
var ErrKeyConflict = errors.New("mirror: key conflicts with an existing object")

// FileTarget is a mirror target on a local file system. Objects are stored
// at <root>/<key>, their metadata at <root>/.mirrorworker/meta/<key>.json,
// and both are written through temporary files under
// <root>/.mirrorworker/tmp/, so a reader never sees a partial object and
// nothing but finished objects lies outside .mirrorworker/.
//
// A FileTarget is safe for concurrent use. Several processes may share a
// root, but Open removes every temporary file, so opening a root fails the
// Puts another process has in progress there (they are retried; nothing
// half-written becomes visible).
type FileTarget struct {
	root    string
	tmpDir  string
	metaDir string

	// dirMu is held while creating missing directories and syncing their
	// parents, so another Put never renames into a directory whose own
	// entry is not yet durable. Only Puts that find a directory missing
	// do that I/O under it.
	dirMu sync.Mutex

	// keyMu serialises the commit (object rename, then metadata rename) of
	// Puts to the same key, so a key's metadata always describes its
	// object. Striped: distinct keys rarely wait on each other.
	keyMu [64]sync.Mutex
}

// Open opens the file target at spec, "file:///abs/dir" or a plain path,
// creating the root and its reserved directories, and removes temporary
// files a crash left behind.
func Open(spec string) (*FileTarget, error) {
	root, err := parseSpec(spec)
	if err != nil {
		return nil, err
	}
	t := &FileTarget{
		root:    root,
		tmpDir:  filepath.Join(root, ReservedDir, "tmp"),
		metaDir: filepath.Join(root, ReservedDir, "meta"),
	}
	for _, d := range []string{t.tmpDir, t.metaDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open target: %w", err)
		}
	}
	entries, err := os.ReadDir(t.tmpDir)
	if err != nil {
		return nil, fmt.Errorf("open target: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(t.tmpDir, e.Name())); err != nil {
			return nil, fmt.Errorf("open target: remove stale temporary file: %w", err)
		}
	}
	return t, nil
}

func parseSpec(spec string) (string, error) {
	if spec == "" {
		return "", errors.New("mirror: empty target")
	}
	path := spec
	if strings.HasPrefix(spec, "file:") || strings.Contains(spec, "://") {
		u, err := url.Parse(spec)
		if err != nil {
			return "", fmt.Errorf("mirror: target %q: %w", spec, err)
		}
		if u.Scheme != "file" {
			return "", fmt.Errorf("mirror: target %q: scheme %q is not supported (only file://)", spec, u.Scheme)
		}
		if u.Host != "" && u.Host != "localhost" {
			return "", fmt.Errorf("mirror: target %q: a file URL names a local absolute path (file:///dir)", spec)
		}
		if u.RawQuery != "" || u.Fragment != "" || !filepath.IsAbs(u.Path) {
			return "", fmt.Errorf("mirror: target %q: a file URL names a local absolute path (file:///dir)", spec)
		}
		path = u.Path
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("mirror: target %q: %w", spec, err)
	}
	return abs, nil
}

// Root returns the absolute root directory.
func (t *FileTarget) Root() string { return t.root }

func (t *FileTarget) objectPath(key string) string {
	return filepath.Join(t.root, filepath.FromSlash(key))
}

func (t *FileTarget) metaPath(key string) string {
	return filepath.Join(t.metaDir, filepath.FromSlash(key)+".json")
}

// Stat returns the stored metadata of key. It returns ErrNotFound when
// there is no metadata, when the object it describes is missing or has
// another size, or when the metadata cannot be read: a caller that gets
// ErrNotFound fetches unconditionally and so never trusts a validator for
// bytes it does not have.
func (t *FileTarget) Stat(ctx context.Context, key string) (Meta, error) {
	if err := ValidateKey(key); err != nil {
		return Meta{}, err
	}
	if err := ctx.Err(); err != nil {
		return Meta{}, err
	}
	data, err := os.ReadFile(t.metaPath(key))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || isNotDir(err) {
			return Meta{}, fmt.Errorf("stat %q: %w", key, ErrNotFound)
		}
		return Meta{}, fmt.Errorf("stat %q: read meta: %w", key, err)
	}
	var m Meta
	if err := json.Unmarshal(data, &m); err != nil {
		return Meta{}, fmt.Errorf("stat %q: unreadable meta (%v): %w", key, err, ErrNotFound)
	}
	fi, err := os.Lstat(t.objectPath(key))
	switch {
	case err != nil && (errors.Is(err, fs.ErrNotExist) || isNotDir(err)):
		return Meta{}, fmt.Errorf("stat %q: meta without object: %w", key, ErrNotFound)
	case err != nil:
		return Meta{}, fmt.Errorf("stat %q: %w", key, err)
	case !fi.Mode().IsRegular():
		return Meta{}, fmt.Errorf("stat %q: object is not a regular file: %w", key, ErrNotFound)
	case fi.Size() != m.Size:
		return Meta{}, fmt.Errorf("stat %q: object is %d bytes, meta says %d: %w", key, fi.Size(), m.Size, ErrNotFound)
	}
	return m, nil
}

// Put stores body under key durably and atomically, with m as its
// metadata, and returns the metadata as stored (Key, SHA256 and Size set
// from the bytes; a URL loses its userinfo). The bytes are checked against
// want before anything is visible: on ErrDigestMismatch, ErrSizeMismatch, a
// read error or a cancelled ctx nothing is stored. When Put returns nil the
// object and its metadata are on stable storage.
//
// An existing object is replaced. Its old metadata is removed durably
// before the new object is renamed into place, so a crash in between
// leaves an object without metadata (fetched again unconditionally), never
// metadata that vouches for other bytes.
func (t *FileTarget) Put(ctx context.Context, key string, body io.Reader, want Expect, m Meta) (Meta, error) {
	if err := ValidateKey(key); err != nil {
		return Meta{}, err
	}
	objTmp, sum, size, err := t.writeTemp(ctx, body)
	if err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	committed := false
	defer func() {
		if !committed {
			os.Remove(objTmp)
		}
	}()
	if want.SHA256 != "" && !strings.EqualFold(want.SHA256, sum) {
		return Meta{}, fmt.Errorf("put %q: got sha256 %s, want %s: %w", key, sum, strings.ToLower(want.SHA256), ErrDigestMismatch)
	}
	if want.HasSize && want.Size >= 0 && want.Size != size {
		return Meta{}, fmt.Errorf("put %q: got %d bytes, want %d: %w", key, size, want.Size, ErrSizeMismatch)
	}

	m.Key, m.SHA256, m.Size = key, sum, size
	m.URL = authority.StripUserinfo(m.URL)
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Meta{}, fmt.Errorf("put %q: encode meta: %w", key, err)
	}
	metaTmp, err := t.writeTempBytes(append(data, '\n'))
	if err != nil {
		return Meta{}, fmt.Errorf("put %q: write meta: %w", key, err)
	}
	defer func() {
		if !committed {
			os.Remove(metaTmp)
		}
	}()

	obj, meta := t.objectPath(key), t.metaPath(key)
	if err := t.mkdirs(t.root, filepath.Dir(obj)); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	if err := t.mkdirs(t.metaDir, filepath.Dir(meta)); err != nil {
		return Meta{}, fmt.Errorf("put %q: meta: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}

	mu := &t.keyMu[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	for _, p := range []string{obj, meta} {
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			return Meta{}, fmt.Errorf("put %q: %s is a directory of other objects: %w", key, p, ErrKeyConflict)
		}
	}
	if err := os.Remove(meta); err == nil {
		if err := syncDir(filepath.Dir(meta)); err != nil {
			return Meta{}, fmt.Errorf("put %q: %w", key, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Meta{}, fmt.Errorf("put %q: remove old meta: %w", key, err)
	}
	if err := os.Rename(objTmp, obj); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	committed = true // the object is in place; its temp name is gone
	if err := syncDir(filepath.Dir(obj)); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	if err := os.Rename(metaTmp, meta); err != nil {
		os.Remove(metaTmp)
		return Meta{}, fmt.Errorf("put %q: meta: %w", key, err)
	}
	if err := syncDir(filepath.Dir(meta)); err != nil {
		return Meta{}, fmt.Errorf("put %q: meta: %w", key, err)
	}
	return m, nil
}

// ProbeSize is how many bytes Probe writes: enough to need fresh blocks on
// a disk that is full, little enough to cost nothing on one that is not.
const ProbeSize = 64 << 10

// Probe proves that the target can store data now: it writes ProbeSize
// bytes to a temporary file under the reserved directory, syncs it and
// removes it. Its error is the one a Put would meet; FailureCode names it.
func (t *FileTarget) Probe(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	path, err := t.writeTempBytes(make([]byte, ProbeSize))
	if err != nil {
		return fmt.Errorf("probe %s: %w", t.root, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("probe %s: %w", t.root, err)
	}
	return nil
}

// writeTemp streams r into a new temporary file, synced and closed, and
// returns its path, the hex sha256 and the size. On error nothing is left.
func (t *FileTarget) writeTemp(ctx context.Context, r io.Reader) (path, sum string, size int64, err error) {
	f, err := os.CreateTemp(t.tmpDir, "obj-*")
	if err != nil {
		return "", "", 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	size, err = io.CopyBuffer(io.MultiWriter(f, h), ctxReader{ctx, r}, *bufp)
	if err != nil {
		return "", "", 0, fmt.Errorf("write: %w", err)
	}
	if err = f.Chmod(0o644); err != nil {
		return "", "", 0, err
	}
	if err = f.Sync(); err != nil {
		return "", "", 0, err
	}
	if err = f.Close(); err != nil {
		return "", "", 0, err
	}
	return f.Name(), hex.EncodeToString(h.Sum(nil)), size, nil
}

func (t *FileTarget) writeTempBytes(data []byte) (path string, err error) {
	f, err := os.CreateTemp(t.tmpDir, "meta-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return "", err
	}
	if err = f.Chmod(0o644); err != nil {
		return "", err
	}
	if err = f.Sync(); err != nil {
		return "", err
	}
	return f.Name(), f.Close()
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 128<<10); return &b }}

// mkdirs creates dir and its missing parents below base (which exists),
// syncing each new directory's parent so the new entry is durable. A file
// where a directory is needed is ErrKeyConflict.
func (t *FileTarget) mkdirs(base, dir string) error {
	rel, err := filepath.Rel(base, dir)
	if err != nil || rel == "." {
		return err
	}
	t.dirMu.Lock()
	defer t.dirMu.Unlock()
	cur := base
	for _, seg := range strings.Split(rel, string(filepath.Separator)) {
		parent := cur
		cur = filepath.Join(cur, seg)
		fi, err := os.Lstat(cur)
		switch {
		case err == nil && fi.IsDir():
			continue
		case err == nil:
			return fmt.Errorf("%s is an object, not a directory: %w", cur, ErrKeyConflict)
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := syncDir(parent); err != nil {
			return err
		}
	}
	return nil
}

// syncDir makes the entries of dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return d.Close()
}

func stripe(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % 64)
}

// isNotDir reports a path through an object ("a/b" when "a" is a file).
func isNotDir(err error) bool { return errors.Is(err, syscall.ENOTDIR) }

// ctxReader stops a copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
