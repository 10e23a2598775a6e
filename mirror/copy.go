package mirror

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// Copy stores the object under from again under to, as a new file with m
// as its metadata (Key, SHA256 and Size from the bytes; ContentType from
// from's metadata when m has none), through Put: the bytes are read from
// from and hashed on their way, so the copy is stored only if they still
// match want. It returns an error wrapping ErrNotFound when from holds no
// object with metadata, ErrDigestMismatch or ErrSizeMismatch when its
// metadata or its bytes differ from want; then nothing is stored.
//
// A copy, not a hard link: the two names are separate objects with their
// own metadata (each its own URL and validators, in the inode's
// attribute), so a later Put, Remove or repair of either never touches
// the other (docs/adr/0034-the-same-bytes-under-another-name.md).
func (t *FileTarget) Copy(ctx context.Context, from, to string, want Expect, m Meta) (Meta, error) {
	src, err := t.Stat(ctx, from)
	if err != nil {
		return Meta{}, fmt.Errorf("copy %q to %q: %w", from, to, err)
	}
	// The metadata is checked first: a stale entry costs no read.
	if want.SHA256 != "" && !strings.EqualFold(src.SHA256, want.SHA256) {
		return Meta{}, fmt.Errorf("copy %q to %q: it holds sha256 %s now, want %s: %w", from, to, src.SHA256, strings.ToLower(want.SHA256), ErrDigestMismatch)
	}
	if want.HasSize && want.Size >= 0 && src.Size != want.Size {
		return Meta{}, fmt.Errorf("copy %q to %q: it holds %d bytes now, want %d: %w", from, to, src.Size, want.Size, ErrSizeMismatch)
	}
	f, err := os.Open(t.objectPath(from))
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, fmt.Errorf("copy %q to %q: %w", from, to, ErrNotFound)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("copy %q to %q: %w", from, to, err)
	}
	defer f.Close()
	if m.ContentType == "" {
		m.ContentType = src.ContentType
	}
	if want.SHA256 == "" {
		want.SHA256 = src.SHA256 // hold the bytes to what from says it holds
	}
	stored, err := t.Put(ctx, to, f, want, m)
	if err != nil {
		return Meta{}, fmt.Errorf("copy from %q: %w", from, err)
	}
	return stored, nil
}
