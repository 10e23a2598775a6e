package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/bucket"
	"github.com/mirrorworker/mirrorworker/mirror/sumindex"
	"github.com/mirrorworker/mirrorworker/worker"
)

// indexTarget wraps target in its sha256 index (docs/adr/0034), so that a
// job whose bytes the target holds under another key is copied, not
// fetched: a file target's index is the bbolt file under its reserved
// directory, a bucket's its objects under .mirrorworker/by-sha256/. close
// releases the file. A file target whose index another process holds (a
// second pod on the volume) is returned as it is, with a warning: its jobs
// are all fetched, as before the index. lockWait is how long to wait for
// that process first (sumindex.DefaultLockWait if 0).
func indexTarget(target storeTarget, lockWait time.Duration, log zerolog.Logger) (_ worker.Target, close func(), _ error) {
	store, ok := target.(sumindex.Store)
	if !ok {
		return target, func() {}, nil
	}
	switch t := target.(type) {
	case *mirror.FileTarget:
		idx, err := sumindex.OpenBolt(sumindex.BoltPath(t.Root()), lockWait)
		if errors.Is(err, sumindex.ErrHeld) {
			log.Warn().Str("index", sumindex.BoltPath(t.Root())).
				Msg("the target's sha256 index is held by another process (another pod on this volume?): this pod fetches every job, copying none from other keys")
			return target, func() {}, nil
		}
		if err != nil {
			return nil, nil, err
		}
		return sumindex.Wrap(store, idx, log), func() { idx.Close() }, nil
	case *bucket.Target:
		return sumindex.Wrap(store, t.SumIndex(), log), func() {}, nil
	}
	return target, func() {}, nil
}

// indexRebuilder is a target's sha256 index as verify rebuilds it.
type indexRebuilder interface {
	Replace(ctx context.Context, entries []sumindex.Entry) (added, dropped, changed int, err error)
}

// rebuildIndex makes the target's sha256 index name, for every digest,
// the first key (in key order) that verify found holding those bytes,
// and says on w what it fixed. A file target's index held by a running
// worker is left alone (that worker forgets a stale entry when a copy
// finds it stale).
func rebuildIndex(ctx context.Context, w io.Writer, t auditTarget, entries []sumindex.Entry) error {
	var idx indexRebuilder
	switch t := t.(type) {
	case *mirror.FileTarget:
		b, err := sumindex.OpenBolt(sumindex.BoltPath(t.Root()), 0)
		if errors.Is(err, sumindex.ErrHeld) {
			fmt.Fprintf(w, "sha256 index %s not rebuilt: a running worker holds it\n", sumindex.BoltPath(t.Root()))
			return nil
		}
		if err != nil {
			return err
		}
		defer b.Close()
		idx = b
	case *bucket.Target:
		idx = t.SumIndex()
	default:
		return nil
	}
	added, dropped, changed, err := idx.Replace(ctx, entries)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "sha256 index rebuilt: %d entries; %d added, %d stale dropped, %d pointed at another key\n", len(entries), added, dropped, changed)
	return nil
}

// A target wrapped in its index still deletes (docs/adr/0033).
var _ worker.Deleter = (*sumindex.Target)(nil)

// A target wrapped in its index still resumes (docs/adr/0035).
var _ worker.Resumer = (*sumindex.Target)(nil)
