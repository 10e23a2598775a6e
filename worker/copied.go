package worker

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
)

// Copier is a Target that can store a job's bytes by copying them from
// another key of the same target that holds them (a local copy, or a
// server-side CopyObject), found by their sha256; *sumindex.Target is one.
// CopyKnown returns the key it copied from; an error wrapping
// mirror.ErrNotFound says there is no such copy (no entry, or a stale
// one), and the job is fetched. An optional feature of a Target, found by
// a type assertion: a target without it fetches every job.
type Copier interface {
	CopyKnown(ctx context.Context, key string, want mirror.Expect, m mirror.Meta) (from string, stored mirror.Meta, err error)
}

// copies counts the jobs stored by a copy within the target, for the
// pod's status, and keeps the digests being fetched. Safe for concurrent
// use.
type copies struct {
	n atomic.Int64

	mu sync.Mutex
	// fetching maps a lowercase sha256 to the one held job that fetches
	// those bytes now (from its admission to its settlement): a second
	// job for the same bytes waits for it instead of fetching them too.
	fetching map[string]*heldJob
}

// reasonSameBytes: the job's bytes are being fetched by another job of
// this worker; it comes back once they are stored, and is copied.
const reasonSameBytes reason = "same_bytes"

// sameBytesWait is the first delay of a job whose bytes another job is
// fetching; it doubles with each delivery, up to sameBytesWaitMax (below
// the park threshold: the job waits in the stream, not in the parking lot).
const (
	sameBytesWait    = 500 * time.Millisecond
	sameBytesWaitMax = 8 * time.Second
)

// lead makes j the job that fetches its bytes, or reports false when
// another job does already.
func (c *copies) lead(j *heldJob) bool {
	sum := strings.ToLower(j.job.SHA256)
	c.mu.Lock()
	defer c.mu.Unlock()
	if other, ok := c.fetching[sum]; ok && other != j {
		return false
	}
	if c.fetching == nil {
		c.fetching = map[string]*heldJob{}
	}
	c.fetching[sum] = j
	return true
}

// settled is told of every delivery settled: a leader's bytes are stored
// (or it failed, or went back to the stream), and the next job for them
// may copy or fetch them.
func (c *copies) settled(j *heldJob) {
	if j.job.SHA256 == "" {
		return
	}
	sum := strings.ToLower(j.job.SHA256)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fetching[sum] == j {
		delete(c.fetching, sum)
	}
}

// copied records one object of j's job stored by a copy from the key
// from, at debug ("object copied", with "from"), and in the summary.
func (l *storedLog) copied(j *heldJob, from string, bytes int64, began time.Time) {
	now := l.clk.Now()
	l.log.Debug().Str("key", j.job.Target).Str("from", from).Int64("bytes", bytes).
		Str("took", now.Sub(began).Round(time.Millisecond).String()).Str("job", j.job.ID).
		Str("authority", j.auth).Msg("object copied")
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.objects == 0 {
		l.since = now
	}
	l.objects++
	l.copiedN++
	l.bytes += bytes
}
