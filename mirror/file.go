package mirror

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
)

// ErrKeyConflict: the key needs a directory where an object is stored, or
// names a directory that holds other objects (keys "a" and "a/b"). Nothing
// was stored. It is permanent for the job.
var ErrKeyConflict = errors.New("mirror: key conflicts with an existing object")

// FileTarget is a mirror target on a local file system. Objects are stored
// at <root>/<key>, written through temporary files under
// <root>/.mirrorworker/tmp/, so a reader never sees a partial object and
// nothing but finished objects lies outside .mirrorworker/.
//
// An object's metadata is an extended attribute of the object itself
// (user.mirrorworker.meta), set before the object is synced and renamed
// into place, so the object and its metadata become visible, and durable,
// together. Where the file system has no user extended attributes (or not
// one as large as the metadata), the metadata is a sidecar file at
// <root>/.mirrorworker/meta/<key>.json, written after the object as
// before; readers look for the attribute first and then the sidecar, so
// objects stored by earlier versions keep their metadata. See
// docs/adr/0013-object-metadata-in-extended-attributes.md.
//
// A FileTarget is safe for concurrent use, and several processes may share
// a root (pods on one volume, replay or verify --repair beside a worker):
// each temporary file is locked (flock(2)) by its writer until it is
// renamed into place or removed, and Open removes only the temporary files
// it can lock, those a killed process left. See
// docs/adr/0032-the-embedded-store-is-locked-and-a-second-signal-stops-now.md.
type FileTarget struct {
	root    string
	tmpDir  string
	metaDir string
	partDir string // kept starts of failed transfers (partial.go)
	opt     Options

	// xattrs: the metadata goes into an attribute of the object. Decided
	// once at Open.
	xattrs bool
	// attrBlock: the metadata attribute takes a block of its own on this
	// file system (probeXattr).
	attrBlock bool
	// sidecars: sidecar files may exist under metaDir (found at Open, or
	// written since), so an object stored with an attribute must remove
	// its key's sidecar first: a reader of an earlier version, which looks
	// only at sidecars, must not find one vouching for other bytes.
	sidecars atomic.Bool

	// creating counts mkdirs calls under way. A Put that finds its
	// directory present while creating is zero knows that directory's
	// entry is durable (whoever made it synced its parent before lowering
	// the count); otherwise mkdirs looks closer.
	creating atomic.Int32

	// dirMu guards unsynced: the directories a mkdirs is creating whose
	// entries may not be durable yet (entered before the mkdir, left after
	// the fsync of the parent). Never held across I/O.
	dirMu    sync.Mutex
	unsynced map[string]int

	// dirSyncs coalesces concurrent fsyncs of one directory.
	dirSyncs dirSyncs
	// syncWhy says why Puts sync as they do (SyncMode).
	syncWhy string

	// keyMu serialises the commit (object rename, then metadata rename) of
	// Puts to the same key that write or remove a sidecar, so a key's
	// sidecar always describes its object. Striped: distinct keys rarely
	// wait on each other. Puts with an attribute only need it to remove a
	// sidecar before their rename.
	keyMu [64]sync.Mutex

	// keptMu guards kept: the files of partDir this process may find
	// there, those Open listed and those it kept since, each with the
	// sequence number of its last keep (keptSeq), so that a Resume that
	// finds the file gone forgets it only if no keep came meanwhile. A key
	// not in it has no file this process could resume, and Resume opens
	// nothing for it (partial.go). Never held across I/O.
	keptMu  sync.Mutex
	kept    map[partialName]uint64
	keptSeq uint64
}

// Options configure a FileTarget. A nil *Options means the zero value.
type Options struct {
	// Sidecar stores every object's metadata in a sidecar file even where
	// the file system has extended attributes: for a root that an earlier
	// version of the worker must still read, and for tests of the fallback.
	Sidecar bool
	// FaultHook, if set, is called at the named steps of each Put (the
	// Fault* constants), for crash tests that kill the process there.
	FaultHook func(point string)
	// ResumeMin is the fewest bytes a Put whose body fails must have
	// received for the target to keep them, under
	// <root>/.mirrorworker/partial/, for the next attempt to resume
	// (Resume, PutResume). DefaultResumeMin; negative: nothing is kept.
	ResumeMin int64
	// PartialMaxAge: kept starts older than this are removed at Open.
	// DefaultPartialMaxAge.
	PartialMaxAge time.Duration
	// SyncFilesystem makes each object durable with syncfs(2) of the
	// root's file system, shared by the Puts waiting at that moment
	// (group commit), instead of an fsync of the object and one of its
	// directory: one device flush for many objects. Every write to that
	// file system, other programs' too, is flushed with it, so it suits a
	// root on a file system of its own. Linux only: OpenWith fails where
	// syncfs does.
	SyncFilesystem bool
	// SyncAuto is SyncFilesystem where the root is a file system of its
	// own: the whole of a local disk's file system (ext4, XFS, btrfs...)
	// mounted exactly at the root and nowhere else, on Linux 5.8 or later
	// (whose syncfs reports write-back errors). Anywhere else each object
	// is fsynced. SyncMode says which was chosen, and why.
	SyncAuto bool
}

// The steps of a Put that Options.FaultHook is called at, in order. The
// steps named Sidecar happen only when the metadata is a sidecar file.
const (
	FaultObjectWritten   = "object-written"    // bytes (and attribute) written, nothing synced
	FaultObjectSynced    = "object-synced"     // temporary object synced, still open
	FaultSidecarWritten  = "sidecar-written"   // temporary sidecar synced
	FaultOldMetaRemoved  = "old-meta-removed"  // the key's previous sidecar removed durably
	FaultObjectRenamed   = "object-renamed"    // object in place, its directory not yet synced
	FaultObjectDirSynced = "object-dir-synced" // object durable in place
	FaultSidecarRenamed  = "sidecar-renamed"   // sidecar in place, its directory not yet synced
	FaultCommitted       = "committed"         // everything durable; Put is about to return
)

// Open opens the file target at spec, "file:///abs/dir" or a plain path,
// with the default options; see OpenWith.
func Open(spec string) (*FileTarget, error) { return OpenWith(spec, nil) }

// OpenWith opens the file target at spec, "file:///abs/dir" or a plain
// path, creating the root and its reserved directories, and removes
// temporary files a crash left behind (those no live writer holds locked;
// another process's Puts in progress are left alone). It finds out once
// whether the file system takes the metadata attribute.
func OpenWith(spec string, o *Options) (*FileTarget, error) {
	root, err := parseSpec(spec)
	if err != nil {
		return nil, err
	}
	t := &FileTarget{
		root:    root,
		tmpDir:  filepath.Join(root, ReservedDir, "tmp"),
		metaDir: filepath.Join(root, ReservedDir, "meta"),
		partDir: filepath.Join(root, ReservedDir, "partial"),
	}
	if o != nil {
		t.opt = *o
	}
	for _, d := range []string{t.tmpDir, t.metaDir, t.partDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open target: %w", err)
		}
	}
	if _, _, err := sweepTemps(t.tmpDir); err != nil {
		return nil, fmt.Errorf("open target: remove stale temporary file: %w", err)
	}
	if t.kept, err = sweepPartials(t.partDir, time.Now(), cmp.Or(t.opt.PartialMaxAge, DefaultPartialMaxAge)); err != nil {
		return nil, fmt.Errorf("open target: remove old partial files: %w", err)
	}
	if t.xattrs, t.attrBlock, err = t.probeXattr(); err != nil {
		return nil, fmt.Errorf("open target: %w", err)
	}
	has := !t.xattrs
	if !has {
		if has, err = hasFile(t.metaDir); err != nil {
			return nil, fmt.Errorf("open target: look for sidecar files: %w", err)
		}
	}
	t.sidecars.Store(has)
	whole, why := t.opt.SyncFilesystem, ""
	if !whole && t.opt.SyncAuto {
		whole, why = ownFileSystem(t.root)
	}
	if whole {
		// Once now: a system without syncfs (not Linux) fails here,
		// not at the first object.
		if err := syncFilesystem(t.root); err != nil {
			if t.opt.SyncFilesystem {
				return nil, fmt.Errorf("open target: %w", err)
			}
			whole, why = false, err.Error()
		}
	}
	if whole {
		t.dirSyncs.whole = func() error { return syncFilesystem(t.root) }
	}
	t.syncWhy = why
	return t, nil
}

// SyncMode reports how Puts make objects durable: by shared syncfs calls
// of the root's file system (filesystem true), or by an fsync of each
// object and of its directory. why says what decided Options.SyncAuto:
// what was found at the root, or why syncfs failed there ("" without
// SyncAuto).
func (t *FileTarget) SyncMode() (filesystem bool, why string) {
	return t.dirSyncs.whole != nil, t.syncWhy
}

// syncObject makes f's bytes and attribute durable: an fsync of f, or,
// with Options.SyncFilesystem (or SyncAuto's finding), the next syncfs of
// the file system.
func (t *FileTarget) syncObject(f *tempFile) error {
	if t.dirSyncs.whole != nil {
		if err := t.dirSyncs.all.sync(t.dirSyncs.whole); err != nil {
			return fmt.Errorf("sync %s: %w", f.name, err)
		}
		return nil
	}
	return f.sync()
}

// hasFile reports whether the tree under dir holds anything but
// directories. It stops at the first such entry, so on a root with
// sidecars it reads one directory or a few; on one without, every
// directory once (the empty ones sidecars of earlier versions left).
func hasFile(dir string) (bool, error) {
	errFound := errors.New("found")
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return errFound
		}
		return nil
	})
	if err == errFound {
		return true, nil
	}
	return false, err
}

// probeXattr reports whether a file in the tmp directory takes the
// metadata attribute (false with Options.Sidecar), and whether an
// attribute as large as an object's usual metadata then takes a block of
// its own (ext4 keeps it in the inode only while it fits the inode's spare
// room: under about 100 bytes with 256-byte inodes, mkfs.ext4's default).
// An empty file has no blocks but that one, so its block count tells.
func (t *FileTarget) probeXattr() (supported, ownBlock bool, err error) {
	if t.opt.Sidecar {
		return false, false, nil
	}
	f, err := createTemp(t.tmpDir, "probe-")
	if err != nil {
		return false, false, err
	}
	defer f.abort()
	switch err := setMetaXattr(f.fd, []byte("{}")); {
	case err == nil:
	case xattrUnsupported(err):
		return false, false, nil
	default:
		return false, false, fmt.Errorf("set attribute %s on %s: %w", xattrName, f.name, err)
	}
	if setMetaXattr(f.fd, typicalMeta) != nil {
		return true, false, nil // larger ones go to sidecars: no block to warn of
	}
	var st syscall.Stat_t
	if syscall.Fstat(f.fd, &st) != nil {
		return true, false, nil
	}
	return true, st.Blocks > 0, nil
}

// typicalMeta is an object's metadata attribute as large as usual (about
// 400 bytes: a key and URL of some 50 characters, validators, sha256,
// times, job id), for probeXattr.
var typicalMeta, _ = json.Marshal(Meta{
	Key:          "releases/2026/12/mirrorworker-1.4.2-linux-amd64.tar.gz",
	URL:          "https://downloads.example.org/releases/2026/12/mirrorworker-1.4.2-linux-amd64.tar.gz",
	ETag:         `"5f3c1a9e-4b2d1c0"`,
	LastModified: "Thu, 03 Dec 2026 10:15:42 GMT",
	ContentType:  "application/gzip",
	SHA256:       strings.Repeat("ab", 32),
	Size:         4096,
	FetchedAt:    time.Date(2026, 12, 3, 10, 16, 0, 123456789, time.UTC),
	JobID:        "MIRROR_JOBS:123456789",
	Enqueued:     time.Date(2026, 12, 3, 10, 15, 59, 987654321, time.UTC),
})

// MetadataTakesABlock reports whether, on this target's file system, an
// object's metadata attribute takes a block of its own, to allocate, write
// and flush with every object (found at Open). On ext4, 1024-byte inodes
// (mkfs.ext4 -I 1024) keep it in the inode.
func (t *FileTarget) MetadataTakesABlock() bool { return t.attrBlock }

// MetadataInXattrs reports whether Put stores metadata as an extended
// attribute of the object (true) or in sidecar files (false).
func (t *FileTarget) MetadataInXattrs() bool { return t.xattrs }

func (t *FileTarget) fault(point string) {
	if t.opt.FaultHook != nil {
		t.opt.FaultHook(point)
	}
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
			return "", fmt.Errorf("mirror: target %q: scheme %q is not supported (file:// or s3://)", spec, u.Scheme)
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

// errNoXattr: an object carries no metadata attribute.
var errNoXattr = errors.New("no metadata attribute")

// Stat returns the stored metadata of key. It returns ErrNotFound when
// there is no object, when the object has no metadata or metadata that
// gives another size, or when the metadata cannot be read: a caller that
// gets ErrNotFound fetches unconditionally and so never trusts a validator
// for bytes it does not have.
//
// The metadata is the object's attribute, or, for an object without one
// (stored by an earlier version, or where the file system has no
// attributes), its sidecar file.
func (t *FileTarget) Stat(ctx context.Context, key string) (Meta, error) {
	if err := ValidateKey(key); err != nil {
		return Meta{}, err
	}
	if err := ctx.Err(); err != nil {
		return Meta{}, err
	}
	// One descriptor for the size, the type and the attribute, so all
	// three describe the same file even while a Put renames over it.
	// O_NONBLOCK: opening a FIFO someone left there must not hang.
	obj := t.objectPath(key)
	fd, err := openRetry(obj, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	switch {
	case err == syscall.ENOENT || err == syscall.ENOTDIR:
		return Meta{}, fmt.Errorf("stat %q: %w", key, ErrNotFound)
	case err == syscall.ELOOP:
		return Meta{}, fmt.Errorf("stat %q: object is a symbolic link: %w", key, ErrNotFound)
	case err != nil:
		return Meta{}, fmt.Errorf("stat %q: %w", key, &fs.PathError{Op: "open", Path: obj, Err: err})
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return Meta{}, fmt.Errorf("stat %q: %w", key, &fs.PathError{Op: "fstat", Path: obj, Err: err})
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return Meta{}, fmt.Errorf("stat %q: object is not a regular file: %w", key, ErrNotFound)
	}
	data, err := getMetaXattr(fd)
	if err == errNoXattr {
		data, err = os.ReadFile(t.metaPath(key))
		if err != nil && (errors.Is(err, fs.ErrNotExist) || isNotDir(err)) {
			return Meta{}, fmt.Errorf("stat %q: object without metadata: %w", key, ErrNotFound)
		}
	}
	if err != nil {
		return Meta{}, fmt.Errorf("stat %q: read meta: %w", key, err)
	}
	var m Meta
	if err := json.Unmarshal(data, &m); err != nil {
		return Meta{}, fmt.Errorf("stat %q: unreadable meta (%v): %w", key, err, ErrNotFound)
	}
	if st.Size != m.Size {
		return Meta{}, fmt.Errorf("stat %q: object is %d bytes, meta says %d: %w", key, st.Size, m.Size, ErrNotFound)
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
// With the metadata in an attribute, the write is: temporary file, bytes,
// attribute, fsync, rename into place, fsync of the directory (shared with
// concurrent Puts into the same directory). The object and its metadata
// are one inode, so they appear, and survive a crash, together.
//
// With a sidecar, an existing object's old sidecar is removed durably
// before the new object is renamed into place, so a crash in between
// leaves an object without metadata (fetched again unconditionally), never
// metadata that vouches for other bytes.
//
// When the body fails (a read error, or ctx cancelled) after at least
// Options.ResumeMin bytes of an answer with a validator to resume with
// (ResumeValidator), the bytes are kept for the next attempt (Resume).
func (t *FileTarget) Put(ctx context.Context, key string, body io.Reader, want Expect, m Meta) (Meta, error) {
	if err := ValidateKey(key); err != nil {
		return Meta{}, err
	}
	f, err := createTemp(t.tmpDir, "obj-")
	if err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	return t.put(ctx, key, f, sha256.New(), body, want, m)
}

// put is Put with the temporary file f and the hash h of what f holds
// already (nothing, or the kept start of the body), appending body.
func (t *FileTarget) put(ctx context.Context, key string, f *tempFile, h hash.Hash, body io.Reader, want Expect, m Meta) (Meta, error) {
	if err := ValidateKey(key); err != nil {
		f.abort()
		return Meta{}, err
	}
	sum, size, err := t.writeTemp(ctx, f, h, body, key, want, m)
	if err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	committed := false
	defer func() {
		if !committed {
			f.abort()
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
	sidecar := !t.xattrs
	if !sidecar {
		data, err := json.Marshal(m)
		if err != nil {
			return Meta{}, fmt.Errorf("put %q: encode meta: %w", key, err)
		}
		switch err := setMetaXattr(f.fd, data); {
		case err == nil:
		case xattrUnsupported(err):
			sidecar = true // too large for this file system's attributes
		default:
			return Meta{}, fmt.Errorf("put %q: write meta: %w", key, &fs.PathError{Op: "setxattr", Path: f.name, Err: err})
		}
	}
	t.fault(FaultObjectWritten)
	if err := t.syncObject(f); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	// f stays open, and locked, until it is renamed: a sweep by another
	// process opening this root must not take it for a crash's leftover.
	t.fault(FaultObjectSynced)

	obj, meta := t.objectPath(key), t.metaPath(key)
	var metaTmp *tempFile
	if sidecar {
		t.sidecars.Store(true)
		data, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			return Meta{}, fmt.Errorf("put %q: encode meta: %w", key, err)
		}
		if metaTmp, err = t.writeTempBytes("meta-", append(data, '\n')); err != nil {
			return Meta{}, fmt.Errorf("put %q: write meta: %w", key, err)
		}
		defer func() {
			if metaTmp != nil {
				metaTmp.abort()
			}
		}()
		t.fault(FaultSidecarWritten)
	}
	if err := t.mkdirs(t.root, filepath.Dir(obj)); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	if sidecar {
		if err := t.mkdirs(t.metaDir, filepath.Dir(meta)); err != nil {
			return Meta{}, fmt.Errorf("put %q: meta: %w", key, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}

	if sidecar || t.sidecars.Load() {
		mu := &t.keyMu[stripe(key)]
		mu.Lock()
		defer mu.Unlock()
		if err := t.removeSidecar(meta, sidecar); err != nil {
			return Meta{}, fmt.Errorf("put %q: %w", key, err)
		}
		t.fault(FaultOldMetaRemoved)
	}
	if err := rename(f.name, obj); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	committed = true // the object is in place; its temp name is gone
	if err := f.close(); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	t.fault(FaultObjectRenamed)
	if err := t.dirSyncs.sync(filepath.Dir(obj)); err != nil {
		return Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	t.fault(FaultObjectDirSynced)
	if sidecar {
		if err := rename(metaTmp.name, meta); err != nil {
			return Meta{}, fmt.Errorf("put %q: meta: %w", key, err)
		}
		err := metaTmp.close()
		metaTmp = nil
		if err != nil {
			return Meta{}, fmt.Errorf("put %q: meta: %w", key, err)
		}
		t.fault(FaultSidecarRenamed)
		if err := t.dirSyncs.sync(filepath.Dir(meta)); err != nil {
			return Meta{}, fmt.Errorf("put %q: meta: %w", key, err)
		}
	}
	t.fault(FaultCommitted)
	return m, nil
}

// removeSidecar removes the sidecar at meta, durably, if there is one.
// For a Put that writes a new sidecar, a directory there is a conflict of
// keys ("a" and "a.json/b"); for one with an attribute it means only that
// there is no sidecar to remove.
func (t *FileTarget) removeSidecar(meta string, writing bool) error {
	switch err := syscall.Unlink(meta); {
	case err == nil:
		return t.dirSyncs.sync(filepath.Dir(meta))
	case err == syscall.ENOENT || err == syscall.ENOTDIR:
		return nil
	case err == syscall.EISDIR || err == syscall.EPERM:
		// Linux says EISDIR for a directory, POSIX EPERM.
		if fi, serr := os.Lstat(meta); serr == nil && fi.IsDir() {
			if writing {
				return fmt.Errorf("%s is a directory of other objects' metadata: %w", meta, ErrKeyConflict)
			}
			return nil
		}
		fallthrough
	default:
		return fmt.Errorf("remove old meta: %w", &fs.PathError{Op: "unlink", Path: meta, Err: err})
	}
}

// rename renames a temporary file into place. A directory at the
// destination, or a file where the path needs a directory, is
// ErrKeyConflict. (os.Rename would first lstat the destination to refuse a
// directory itself; the kernel refuses it anyway, with EISDIR.)
func rename(from, to string) error {
	err := syscall.Rename(from, to)
	for err == syscall.EINTR {
		err = syscall.Rename(from, to)
	}
	switch err {
	case nil:
		return nil
	case syscall.EISDIR, syscall.ENOTEMPTY, syscall.EEXIST:
		return fmt.Errorf("%s is a directory of other objects: %w", to, ErrKeyConflict)
	case syscall.ENOTDIR:
		return fmt.Errorf("%s: a parent is an object, not a directory: %w", to, ErrKeyConflict)
	}
	return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
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
	f, err := t.writeTempBytes("probe-", make([]byte, ProbeSize))
	if err != nil {
		return fmt.Errorf("probe %s: %w", t.root, err)
	}
	if err := f.remove(); err != nil {
		return fmt.Errorf("probe %s: %w", t.root, err)
	}
	return nil
}

// writeTemp appends r to the temporary file f, whose bytes so far hash
// to h, and returns the hex sha256 and the size of all its bytes, f still
// open and not yet synced. On error f is gone: removed, or, when r failed
// after enough bytes of an answer that can be resumed (keepable), kept
// for the next attempt at key.
func (t *FileTarget) writeTemp(ctx context.Context, f *tempFile, h hash.Hash, r io.Reader, key string, want Expect, m Meta) (sum string, size int64, err error) {
	src := &readErr{r: ctxReader{ctx, r}}
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	_, err = io.CopyBuffer(io.MultiWriter(f, h), src, *bufp)
	if err != nil {
		if src.err != nil && errors.Is(err, src.err) && t.keepable(f.written, want, m) {
			rec := partialRecord{Key: key, URL: authority.StripUserinfo(m.URL), ETag: m.ETag, LastModified: m.LastModified, Size: f.written}
			if kerr := t.keep(f, h, rec); kerr != nil {
				return "", 0, fmt.Errorf("write: %w (and %v)", err, kerr)
			}
			return "", 0, fmt.Errorf("write: %w (%d bytes kept to resume)", err, rec.Size)
		}
		f.abort()
		return "", 0, fmt.Errorf("write: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), f.written, nil
}

// readErr remembers its reader's error, to tell a failing body (whose
// bytes so far may be kept) from a failing disk.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// writeTempBytes writes data to a new temporary file, synced and still
// open (so locked, see tempFile): the caller closes it once it is renamed
// or removed.
func (t *FileTarget) writeTempBytes(prefix string, data []byte) (_ *tempFile, err error) {
	f, err := createTemp(t.tmpDir, prefix)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.abort()
		}
	}()
	if _, err = f.Write(data); err != nil {
		return nil, err
	}
	if err = f.sync(); err != nil {
		return nil, err
	}
	return f, nil
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
	// The common case: the directory is there, and no mkdirs is under way
	// that might have made it without syncing its parent yet (creating is
	// raised before any mkdir, so seeing the directory and then zero means
	// the one who made it is done).
	if fi, err := os.Lstat(dir); err == nil && fi.IsDir() && t.creating.Load() == 0 {
		return nil
	}
	t.creating.Add(1)
	defer t.creating.Add(-1)
	// A segment another Put is creating is made durable by an fsync of its
	// parent that starts after the segment is seen to exist. The fsyncs
	// go through dirSyncs, so Puts creating many directories under one
	// parent (a new authority each) share one fsync of it instead of
	// taking turns, each with its own, under one lock (issue 40: 13 s of
	// lock wait in a warm-up of 1,000 authorities, ADR 0036).
	cur := base
	for _, seg := range strings.Split(rel, string(filepath.Separator)) {
		parent := cur
		cur = filepath.Join(cur, seg)
		fi, err := os.Lstat(cur)
		switch {
		case err == nil && fi.IsDir():
			if t.isUnsynced(cur) {
				if err := t.dirSyncs.sync(parent); err != nil {
					return err
				}
			}
			continue
		case err == nil:
			return fmt.Errorf("%s is an object, not a directory: %w", cur, ErrKeyConflict)
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if err := t.createDir(parent, cur); err != nil {
			return err
		}
	}
	return nil
}

// createDir makes dir, whose parent exists, and makes its entry durable.
// Until then it is listed as unsynced, so that a concurrent mkdirs that
// finds it does not take it for durable.
func (t *FileTarget) createDir(parent, dir string) error {
	t.dirMu.Lock()
	if t.unsynced == nil {
		t.unsynced = make(map[string]int)
	}
	t.unsynced[dir]++
	t.dirMu.Unlock()
	defer func() {
		t.dirMu.Lock()
		if t.unsynced[dir]--; t.unsynced[dir] == 0 {
			delete(t.unsynced, dir)
		}
		t.dirMu.Unlock()
	}()
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// Made by this call or by another (EEXIST): either way the fsync
	// starts after it exists.
	return t.dirSyncs.sync(parent)
}

// isUnsynced reports whether a mkdirs is creating dir and may not have
// made its entry durable yet.
func (t *FileTarget) isUnsynced(dir string) bool {
	t.dirMu.Lock()
	defer t.dirMu.Unlock()
	return t.unsynced[dir] > 0
}

func stripe(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % 64)
}

// isNotDir reports a path through an object ("a/b" when "a" is a file).
func isNotDir(err error) bool { return errors.Is(err, syscall.ENOTDIR) }

// ContextReader returns r, failing every read with ctx's error once ctx is
// done: a copy into a target stops when its job's context ends.
func ContextReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx, r} }

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

// List calls fn with the key of every object in the target, in lexical
// order of the paths, skipping the reserved directory; fn's error stops
// the walk and is returned. Entries that are not regular files (a FIFO, a
// symbolic link) are passed too: Stat refuses them, and an audit reports
// them.
func (t *FileTarget) List(ctx context.Context, fn func(key string) error) error {
	return filepath.WalkDir(t.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, rerr := filepath.Rel(t.root, p)
		if rerr != nil || rel == "." {
			return rerr
		}
		if d.IsDir() {
			if rel == ReservedDir {
				return filepath.SkipDir
			}
			return nil
		}
		return fn(filepath.ToSlash(rel))
	})
}

// Read opens the object stored under key for reading.
func (t *FileTarget) Read(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	f, err := os.Open(t.objectPath(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %q: %w", key, ErrNotFound)
	}
	return f, err
}

// Remove deletes the object under key and its metadata, durably, so that
// its next fetch is unconditional (an audit's repair of a corrupt object).
// A key with nothing stored is not an error.
func (t *FileTarget) Remove(ctx context.Context, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	mu := &t.keyMu[stripe(key)]
	mu.Lock()
	defer mu.Unlock()
	if err := t.removeLocked(key); err != nil {
		return fmt.Errorf("remove %q: %w", key, err)
	}
	return nil
}

// removeLocked removes key's sidecar and object, durably; the key's keyMu
// stripe is held (Remove, Delete).
func (t *FileTarget) removeLocked(key string) error {
	if err := t.removeSidecar(t.metaPath(key), false); err != nil {
		return err
	}
	obj := t.objectPath(key)
	if err := os.Remove(obj); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := t.dirSyncs.sync(filepath.Dir(obj)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
