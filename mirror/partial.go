package mirror

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Defaults of the options that keep the start of a failed transfer
// (Options.ResumeMin, Options.PartialMaxAge); see
// docs/adr/0035-downloads-resume-from-what-was-kept.md.
const (
	// DefaultResumeMin is the fewest bytes a failed transfer must have
	// brought for the target to keep them: below it the disk and the
	// fsync cost more than asking for the body again.
	DefaultResumeMin = 1 << 20
	// DefaultPartialMaxAge is how long a kept start may wait for its
	// retry: older ones are removed when a target is opened.
	DefaultPartialMaxAge = 24 * time.Hour
)

// Partial is the start of a body that a target kept when its transfer
// failed, for a later attempt to ask only for the rest (fetch.Request.From).
type Partial struct {
	Size int64 // bytes kept: the rest starts there
	// ETag and LastModified are the validators of the answer the bytes
	// came with; IfRange chooses the one to send.
	ETag         string
	LastModified string
	URL          string // the job's URL, without userinfo
}

// IfRange is the If-Range value that asks for the rest of the same body.
func (p Partial) IfRange() string { return ResumeValidator(p.ETag, p.LastModified) }

// ResumeValidator returns the validator a transfer may be resumed with:
// a strong ETag, else, when there is no ETag at all, the Last-Modified
// date; "" when there is none (no validator, or only a weak ETag, which
// RFC 9110 section 13.1.5 forbids in If-Range): such a body is never kept.
func ResumeValidator(etag, lastModified string) string {
	switch {
	case etag != "" && !strings.HasPrefix(etag, "W/"):
		return etag
	case etag == "":
		return lastModified
	}
	return ""
}

// Kept is a Partial a target holds for one attempt, found by Resume.
// Exactly one of PutResume, Release or Discard must follow. A Kept is not
// safe for concurrent use.
type Kept interface {
	Partial() Partial
	// Release keeps the bytes for a later attempt, unused by this one (its
	// request failed before a body came).
	Release()
	// Discard removes them (an origin that cannot serve their rest).
	Discard()
}

// partialMagic ends every kept file, after its record: a file without
// it is not one this version wrote whole.
const partialMagic = "mwpart01"

// partialRecord describes a kept file's bytes; it is written after them,
// as the file's trailer, so that the bytes and their description are one
// file, replaced whole by a rename.
type partialRecord struct {
	Key          string `json:"key"`
	URL          string `json:"url"`
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"last_modified,omitempty"`
	Size         int64  `json:"size"`
	// SHA256State is the hash of the Size bytes, as its MarshalBinary
	// gives it: a resumed Put goes on from it without reading them again.
	SHA256State []byte `json:"sha256_state"`
}

// fileKept is a FileTarget's Kept: a locked temporary file holding the
// kept bytes (the trailer cut off), and their hash so far.
type fileKept struct {
	t   *FileTarget
	f   *tempFile
	h   hash.Hash
	rec partialRecord
}

func (k *fileKept) Partial() Partial {
	return Partial{Size: k.rec.Size, ETag: k.rec.ETag, LastModified: k.rec.LastModified, URL: k.rec.URL}
}

func (k *fileKept) Release() {
	if k.f == nil {
		return
	}
	_ = k.t.keep(k.f, k.h, k.rec)
	k.f = nil
}

func (k *fileKept) Discard() {
	if k.f == nil {
		return
	}
	k.f.abort()
	k.f = nil
}

// partialPath is where the kept start of key's body waits: one file per
// key, whose name does not reveal the key.
func (t *FileTarget) partialPath(key string) string {
	return t.partialFile(partialNameOf(key))
}

// partialName is the name of a key's kept file under partDir, as bytes:
// the first 20 bytes of the key's sha256, hex-encoded in the name.
type partialName [20]byte

func partialNameOf(key string) partialName {
	s := sha256.Sum256([]byte(key))
	return partialName(s[:20])
}

func (t *FileTarget) partialFile(n partialName) string {
	return filepath.Join(t.partDir, hex.EncodeToString(n[:]))
}

// partialNameFrom is the partialName a file under partDir is named by, if
// it is one.
func partialNameFrom(file string) (n partialName, ok bool) {
	b, err := hex.DecodeString(file)
	if err != nil || len(b) != len(n) {
		return n, false
	}
	copy(n[:], b)
	return n, true
}

// noteKept records that this process kept n's file.
func (t *FileTarget) noteKept(n partialName) {
	t.keptMu.Lock()
	defer t.keptMu.Unlock()
	t.keptSeq++
	t.kept[n] = t.keptSeq
}

// anyKept reports whether any kept file may be there.
func (t *FileTarget) anyKept() bool {
	t.keptMu.Lock()
	defer t.keptMu.Unlock()
	return len(t.kept) > 0
}

// mayHoldKept reports whether n's file may be there, and the sequence
// number of its last keep, for forgetKept.
func (t *FileTarget) mayHoldKept(n partialName) (seq uint64, ok bool) {
	t.keptMu.Lock()
	defer t.keptMu.Unlock()
	seq, ok = t.kept[n]
	return seq, ok
}

// forgetKept forgets n's file, found gone or taken, unless it was kept
// again since mayHoldKept said seq.
func (t *FileTarget) forgetKept(n partialName, seq uint64) {
	t.keptMu.Lock()
	defer t.keptMu.Unlock()
	if cur, ok := t.kept[n]; ok && cur == seq {
		delete(t.kept, n)
	}
}

// keepable reports whether a failed transfer of size bytes with the
// metadata m is kept for a retry: not when it brought all the bytes the
// job expects (or more), which no range can complete.
func (t *FileTarget) keepable(size int64, want Expect, m Meta) bool {
	minSize := t.opt.ResumeMin
	if minSize == 0 {
		minSize = DefaultResumeMin
	}
	if want.HasSize && size >= want.Size {
		return false
	}
	return minSize > 0 && size >= minSize && ResumeValidator(m.ETag, m.LastModified) != ""
}

// keep makes the open temporary file f, holding the first rec.Size bytes
// of key's body whose hash so far is h, the key's kept start: it appends
// the record, syncs, and renames the file over the key's previous one
// (the last attempt's bytes win), then closes it, which releases it to
// the next attempt. On error f is removed.
func (t *FileTarget) keep(f *tempFile, h hash.Hash, rec partialRecord) (err error) {
	defer func() {
		if err != nil {
			f.abort()
		}
	}()
	state, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return fmt.Errorf("keep partial: %w", err)
	}
	rec.SHA256State = state
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("keep partial: %w", err)
	}
	data = binary.BigEndian.AppendUint64(data, uint64(len(data)))
	data = append(data, partialMagic...)
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("keep partial: %w", err)
	}
	// Synced before it takes the name: a kept file after a crash holds
	// the bytes its record describes.
	if err := f.sync(); err != nil {
		return fmt.Errorf("keep partial: %w", err)
	}
	n := partialNameOf(rec.Key)
	if err := rename(f.name, t.partialFile(n)); err != nil {
		return fmt.Errorf("keep partial: %w", err)
	}
	t.noteKept(n)
	return f.close()
}

// Resume finds the start of key's body that an earlier attempt kept,
// fetched from url, and takes it for this attempt: it returns nil (and no
// error) when there is none, when another writer holds it, or when it was
// fetched from another URL or is unreadable (then it is removed). The
// Kept holds the bytes locked, under a temporary name of its own, so
// neither a sweep nor a second writer of the key touches them until it is
// released, discarded or used by PutResume.
func (t *FileTarget) Resume(ctx context.Context, key, url string) (Kept, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Kept files come from this process's failed transfers, or were there
	// when it opened the target: for any other key there is nothing to
	// open (a failed open per job cost more than the rest of Resume). A
	// file another process kept since is not resumed here: the body comes
	// whole, as from a bucket served by another pod (ADR 0035).
	if !t.anyKept() {
		return nil, nil // nothing kept at all, the usual case: not even a hash
	}
	n := partialNameOf(key)
	seq, ok := t.mayHoldKept(n)
	if !ok {
		return nil, nil
	}
	p := t.partialFile(n)
	fd, err := openRetry(p, syscall.O_RDWR|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	switch {
	case err == syscall.ENOENT:
		t.forgetKept(n, seq)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("resume %q: %w", key, &fs.PathError{Op: "open", Path: p, Err: err})
	}
	f := &tempFile{fd: fd, name: p}
	switch err := flockRetry(fd, syscall.LOCK_EX|syscall.LOCK_NB); {
	case err == syscall.EWOULDBLOCK:
		f.close()
		return nil, nil // another attempt at this key has it
	case err != nil && !noLocks(err):
		f.close()
		return nil, fmt.Errorf("resume %q: %w", key, &fs.PathError{Op: "flock", Path: p, Err: err})
	}
	// Locked; but the name may have moved on to another file meanwhile
	// (taken, kept again, swept): then this one is not the key's.
	var held, named syscall.Stat_t
	if err := syscall.Fstat(fd, &held); err != nil {
		f.close()
		return nil, fmt.Errorf("resume %q: %w", key, &fs.PathError{Op: "fstat", Path: p, Err: err})
	}
	if err := syscall.Lstat(p, &named); err != nil || named.Dev != held.Dev || named.Ino != held.Ino {
		f.close()
		return nil, nil
	}
	rec, err := readTrailer(fd, held.Size)
	if err != nil || rec.Key != key || rec.URL != url || ResumeValidator(rec.ETag, rec.LastModified) == "" {
		// Not a start this attempt can use: a later one could not either.
		f.abort()
		return nil, nil
	}
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(rec.SHA256State); err != nil {
		f.abort()
		return nil, nil
	}
	// Take it under a name of its own, so that a failure of this attempt
	// keeps its bytes by renaming them back, over whatever came meanwhile.
	name, err := t.linkTemp(p, "res-")
	if err != nil {
		f.close()
		return nil, fmt.Errorf("resume %q: %w", key, err)
	}
	f.name = name
	if err := syscall.Unlink(p); err != nil && err != syscall.ENOENT {
		f.abort()
		return nil, fmt.Errorf("resume %q: %w", key, &fs.PathError{Op: "unlink", Path: p, Err: err})
	}
	t.forgetKept(n, seq) // taken: a failure of this attempt keeps it again
	if err := f.truncate(rec.Size); err != nil {
		f.abort()
		return nil, fmt.Errorf("resume %q: %w", key, err)
	}
	return &fileKept{t: t, f: f, h: h, rec: rec}, nil
}

// linkTemp gives the file at p a second, new name under the tmp directory.
func (t *FileTarget) linkTemp(p, prefix string) (string, error) {
	for range 10000 {
		name := filepath.Join(t.tmpDir, prefix+strconv.FormatUint(uint64(rand.Uint32()), 10))
		err := syscall.Link(p, name)
		for err == syscall.EINTR {
			err = syscall.Link(p, name)
		}
		switch {
		case err == nil:
			return name, nil
		case err != syscall.EEXIST:
			return "", &os.LinkError{Op: "link", Old: p, New: name, Err: err}
		}
	}
	return "", &fs.PathError{Op: "link", Path: filepath.Join(t.tmpDir, prefix+"*"), Err: fs.ErrExist}
}

// readTrailer reads the record at the end of a kept file of size bytes,
// and checks that it describes every byte before it.
func readTrailer(fd int, size int64) (partialRecord, error) {
	var rec partialRecord
	tail := make([]byte, 8+len(partialMagic))
	if size < int64(len(tail)) {
		return rec, errors.New("no trailer")
	}
	if _, err := syscall.Pread(fd, tail, size-int64(len(tail))); err != nil {
		return rec, err
	}
	if string(tail[8:]) != partialMagic {
		return rec, errors.New("no trailer")
	}
	n := int64(binary.BigEndian.Uint64(tail[:8]))
	if n <= 0 || n > 1<<16 || n > size-int64(len(tail)) {
		return rec, errors.New("bad trailer length")
	}
	data := make([]byte, n)
	if _, err := syscall.Pread(fd, data, size-int64(len(tail))-n); err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, err
	}
	if rec.Size != size-int64(len(tail))-n {
		return rec, fmt.Errorf("record says %d bytes, the file holds %d", rec.Size, size-int64(len(tail))-n)
	}
	return rec, nil
}

// sweepPartials removes the kept files under dir not modified since
// maxAge before now (their retry is not coming) and that no attempt holds,
// and returns the names of those it leaves (FileTarget.kept): one read of
// the directory at Open for both.
func sweepPartials(dir string, now time.Time, maxAge time.Duration) (map[partialName]uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	left := make(map[partialName]uint64, len(entries))
	keep := func(file string) {
		if n, ok := partialNameFrom(file); ok {
			left[n] = 0
		}
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() {
			if err := os.RemoveAll(p); err != nil {
				return nil, err
			}
			continue
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if now.Sub(fi.ModTime()) < maxAge {
			keep(e.Name())
			continue
		}
		removed, err := sweepFile(p)
		if err != nil {
			return nil, err
		}
		if !removed {
			keep(e.Name()) // held by an attempt, or gone: Resume forgets it then
		}
	}
	return left, nil
}

// PutResume is Put for an attempt that took k (Resume): the body's first
// from bytes are k's, and body brings the rest; from is k's size (the
// origin answered the range) or 0 (it sent the whole body: k's bytes are
// dropped). want and the stored SHA256 and Size are the whole body's, the
// hash going on from k's. A failed transfer keeps all the bytes received
// so far, k's and the new ones, for the next attempt, as Put does.
func (t *FileTarget) PutResume(ctx context.Context, key string, k Kept, from int64, body io.Reader, want Expect, m Meta) (Meta, error) {
	fk, ok := k.(*fileKept)
	if !ok || fk.t != t || fk.f == nil || fk.rec.Key != key {
		return Meta{}, fmt.Errorf("put %q: resume: not a start this target kept for the key", key)
	}
	f, h := fk.f, fk.h
	fk.f = nil // the Put owns the file now
	switch from {
	case fk.rec.Size:
	case 0:
		if err := f.truncate(0); err != nil {
			f.abort()
			return Meta{}, fmt.Errorf("put %q: %w", key, err)
		}
		h.Reset()
	default:
		f.abort()
		return Meta{}, fmt.Errorf("put %q: resume from byte %d, %d bytes kept", key, from, fk.rec.Size)
	}
	return t.put(ctx, key, f, h, body, want, m)
}

// truncate cuts the file to size bytes and writes on from there.
func (f *tempFile) truncate(size int64) error {
	if err := f.op("ftruncate", func() error { return syscall.Ftruncate(f.fd, size) }); err != nil {
		return err
	}
	if err := f.op("lseek", func() error { _, err := syscall.Seek(f.fd, size, io.SeekStart); return err }); err != nil {
		return err
	}
	f.written, f.flushed = size, size
	return nil
}
