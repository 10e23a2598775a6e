// Package sumindex keeps a mirror target's sha256 index, from a digest to
// one key of the target that holds those bytes, and stores a job whose
// bytes the target already holds by a copy within the target instead of a
// request to the origin (docs/adr/0034-the-same-bytes-under-another-name.md).
//
// An entry is a hint, never a promise: every copy checks that the key it
// copies from still holds the digest (and size) the job asks for, and an
// entry that fails the check is forgotten, so the job is fetched instead.
// The index therefore needs no transaction with the object it names: a
// crash between a Put and its entry costs one later fetch, nothing worse.
//
// It provides the index's interface, the file target's index (Bolt, a
// bbolt file under the target's reserved directory) and Target, the
// wrapper that keeps the index as objects are stored. A bucket's index
// lives in package bucket. It does not decide when a job may be copied:
// the worker asks, before it asks the pacer for anything.
package sumindex

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/mirror"
)

// Index maps a sha256 (64 lowercase hex) to one key said to hold those
// bytes. Implementations are safe for concurrent use.
type Index interface {
	// Lookup returns the key recorded for sum, or an error wrapping
	// mirror.ErrNotFound when there is none.
	Lookup(ctx context.Context, sum string) (string, error)
	// Add records key for sum, replacing any other key.
	Add(ctx context.Context, sum, key string) error
	// Forget removes sum's entry if it still names key (a copy found key
	// no longer holds those bytes); an entry for another key stays.
	Forget(ctx context.Context, sum, key string) error
}

// Store is a target that can copy one of its objects to another key
// within itself; *mirror.FileTarget and *bucket.Target are.
type Store interface {
	Stat(ctx context.Context, key string) (mirror.Meta, error)
	Put(ctx context.Context, key string, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error)
	Probe(ctx context.Context) error
	// Copy stores the object under from again under to, with m as its
	// metadata, only if from still holds bytes that match want; otherwise
	// it stores nothing and returns an error wrapping
	// mirror.ErrDigestMismatch, mirror.ErrSizeMismatch or
	// mirror.ErrNotFound.
	Copy(ctx context.Context, from, to string, want mirror.Expect, m mirror.Meta) (mirror.Meta, error)
}

// ErrNoCopy: the target holds no verified copy of the bytes a job asks
// for (no sha256 in the job, no entry, or a stale one); the job is
// fetched. It wraps mirror.ErrNotFound.
var ErrNoCopy = fmt.Errorf("sumindex: no stored copy: %w", mirror.ErrNotFound)

// writeTimeout bounds an index write that outlives its caller's context:
// the object is stored (or found stale) whatever the caller does next, so
// the index hears of it, but a bucket index that does not answer must not
// hold the stopping worker's fetch slot for ever.
const writeTimeout = 10 * time.Second

// Target is a Store that records the digest of every object it stores in
// an Index, and can store a job's bytes by copying them from another key
// (CopyKnown). It is safe for concurrent use if its Store and Index are.
type Target struct {
	Store
	idx Index
	log zerolog.Logger
}

// Wrap returns s keeping idx. A failure to record an entry is logged to
// log, not returned: the object is stored, and only a later copy of it is
// lost (it is fetched instead).
func Wrap(s Store, idx Index, log zerolog.Logger) *Target {
	return &Target{Store: s, idx: idx, log: log}
}

// Index returns the index the target keeps.
func (t *Target) Index() Index { return t.idx }

// Put stores the object (Store.Put) and then records its digest.
func (t *Target) Put(ctx context.Context, key string, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	stored, err := t.Store.Put(ctx, key, body, want, m)
	return t.record(ctx, key, stored, err)
}

// record enters the digest of an object just stored under key (unless
// err says it was not) and returns stored and err unchanged.
func (t *Target) record(ctx context.Context, key string, stored mirror.Meta, err error) (mirror.Meta, error) {
	if err != nil || stored.SHA256 == "" {
		return stored, err
	}
	// An entry for these bytes is left alone, whichever key it names, and
	// that key is not read: a read per Put of bytes stored before (a Stat,
	// its xattr and JSON) cost more than the rest of the index together,
	// and buys little, since CopyKnown checks the bytes of every entry it
	// uses and forgets a stale one. A stale entry left here costs at most
	// one later fetch, by the first job that meets it (ADR 0034).
	if _, lerr := t.idx.Lookup(ctx, stored.SHA256); lerr == nil {
		return stored, nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if err := t.idx.Add(actx, stored.SHA256, key); err != nil {
		t.log.Warn().Err(err).Str("key", key).Msg("record the object's sha256 in the index; later jobs for the same bytes fetch them")
	}
	return stored, nil
}

// CopyKnown stores under key the bytes want names, copied from another
// key of the target that the index says holds them, and returns that key
// and the metadata as stored. No request goes to any origin. It returns
// an error wrapping ErrNoCopy when want names no sha256, when the index
// has no entry for it, or when the entry is stale (the key it names holds
// other bytes now, or nothing): a stale entry is forgotten. Any other
// error is the target's, from the copy.
func (t *Target) CopyKnown(ctx context.Context, key string, want mirror.Expect, m mirror.Meta) (string, mirror.Meta, error) {
	sum := strings.ToLower(want.SHA256)
	if !ValidSum(sum) {
		return "", mirror.Meta{}, ErrNoCopy
	}
	from, err := t.idx.Lookup(ctx, sum)
	switch {
	case errors.Is(err, mirror.ErrNotFound):
		return "", mirror.Meta{}, ErrNoCopy
	case err != nil:
		return "", mirror.Meta{}, fmt.Errorf("copy %q: look up sha256 %s: %w", key, sum, err)
	case from == key:
		// The key itself was recorded, yet the caller found other bytes
		// there (or none): a stale entry.
		t.forget(ctx, sum, from)
		return "", mirror.Meta{}, ErrNoCopy
	}
	want.SHA256 = sum
	stored, err := t.Store.Copy(ctx, from, key, want, m)
	if err == nil {
		return from, stored, nil
	}
	if errors.Is(err, mirror.ErrNotFound) || errors.Is(err, mirror.ErrDigestMismatch) || errors.Is(err, mirror.ErrSizeMismatch) {
		t.forget(ctx, sum, from)
		return "", mirror.Meta{}, fmt.Errorf("copy %q from %q: stale index entry (%v): %w", key, from, err, ErrNoCopy)
	}
	return "", mirror.Meta{}, fmt.Errorf("copy %q from %q: %w", key, from, err)
}

func (t *Target) forget(ctx context.Context, sum, key string) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if err := t.idx.Forget(fctx, sum, key); err != nil {
		t.log.Warn().Err(err).Str("key", key).Msg("forget a stale sha256 index entry")
	}
}

// ValidSum reports whether s is a sha256 as the index keeps it: 64
// lowercase hex digits.
func ValidSum(s string) bool {
	if len(s) != 64 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
