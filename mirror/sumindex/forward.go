package sumindex

import (
	"context"
	"fmt"

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
