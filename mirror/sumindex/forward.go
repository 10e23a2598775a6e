package sumindex

import (
	"context"
	"fmt"
	"io"

	"github.com/mirrorworker/mirrorworker/mirror"
)

// The optional features of a Store, forwarded through Target so that
// wrapping a target in its index hides none of them from the worker, which
// finds them by type assertion. A Store without one returns an error
// saying so; *mirror.FileTarget and *bucket.Target have them all.

type deleter interface {
	Delete(ctx context.Context, key string, ts mirror.Tombstone) error
	Tombstone(ctx context.Context, key string) (mirror.Tombstone, error)
	ClearTombstone(ctx context.Context, key string) error
}

func (t *Target) deleter() (deleter, error) {
	d, ok := t.Store.(deleter)
	if !ok {
		return nil, fmt.Errorf("sumindex: the target %T cannot delete", t.Store)
	}
	return d, nil
}

// Delete removes key and leaves its tombstone (the Store's Delete). An
// index entry that named key goes stale, and is forgotten by the first
// copy that finds it so.
func (t *Target) Delete(ctx context.Context, key string, ts mirror.Tombstone) error {
	d, err := t.deleter()
	if err != nil {
		return err
	}
	return d.Delete(ctx, key, ts)
}

// Tombstone is the Store's.
func (t *Target) Tombstone(ctx context.Context, key string) (mirror.Tombstone, error) {
	d, err := t.deleter()
	if err != nil {
		return mirror.Tombstone{}, err
	}
	return d.Tombstone(ctx, key)
}

// ClearTombstone is the Store's.
func (t *Target) ClearTombstone(ctx context.Context, key string) error {
	d, err := t.deleter()
	if err != nil {
		return err
	}
	return d.ClearTombstone(ctx, key)
}

type resumer interface {
	Resume(ctx context.Context, key, url string) (mirror.Kept, error)
	PutResume(ctx context.Context, key string, k mirror.Kept, from int64, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error)
}

// Resume is the Store's: the start of key's body an earlier attempt kept
// (docs/adr/0035); nil, and no error, when the Store keeps none.
func (t *Target) Resume(ctx context.Context, key, url string) (mirror.Kept, error) {
	r, ok := t.Store.(resumer)
	if !ok {
		return nil, nil
	}
	return r.Resume(ctx, key, url)
}

// PutResume is the Store's, and records the stored object's digest as Put
// does. Only a Kept that Resume returned reaches it.
func (t *Target) PutResume(ctx context.Context, key string, k mirror.Kept, from int64, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	r, ok := t.Store.(resumer)
	if !ok {
		return mirror.Meta{}, fmt.Errorf("sumindex: the target %T cannot resume", t.Store)
	}
	stored, err := r.PutResume(ctx, key, k, from, body, want, m)
	return t.record(ctx, key, stored, err)
}
