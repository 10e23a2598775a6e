package worker

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mirrorworker/mirrorworker/bytesize"
)

// ShutdownReportEvery is how often a stopping worker says again what it
// still waits for: a stop that waits in silence looks hung (issue 36: 14 s
// of silence after "handing back held jobs").
const ShutdownReportEvery = 5 * time.Second

// fetchProgress is one fetch a slot runs: its URL and the bytes of its body
// read so far, of the size expected (-1: unknown until the answer says).
type fetchProgress struct {
	url     string
	started time.Time
	got     atomic.Int64
	size    atomic.Int64
}

// inFlight are the fetches the slots run, for the stop's report. Safe for
// concurrent use.
type inFlight struct {
	mu sync.Mutex
	m  map[*heldJob]*fetchProgress
}

// add records j's fetch; done removes it.
func (f *inFlight) add(j *heldJob, now time.Time) (p *fetchProgress, done func()) {
	p = &fetchProgress{url: j.job.URL, started: now}
	size := int64(-1)
	if j.job.Size != nil {
		size = *j.job.Size
	}
	p.size.Store(size)
	f.mu.Lock()
	if f.m == nil {
		f.m = map[*heldJob]*fetchProgress{}
	}
	f.m[j] = p
	f.mu.Unlock()
	return p, func() {
		f.mu.Lock()
		delete(f.m, j)
		f.mu.Unlock()
	}
}

// describe is the fetches in flight, oldest first, as "URL (312MB of
// 500MB)", and how many there are.
func (f *inFlight) describe() (n int, text string) {
	f.mu.Lock()
	ps := make([]*fetchProgress, 0, len(f.m))
	for _, p := range f.m {
		ps = append(ps, p)
	}
	f.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].started.Before(ps[j].started) })
	const shown = 5 // a stop with many fetches names the oldest
	parts := make([]string, 0, min(len(ps), shown))
	for _, p := range ps[:min(len(ps), shown)] {
		got, size := p.got.Load(), p.size.Load()
		if size >= 0 {
			parts = append(parts, fmt.Sprintf("%s (%s of %s)", p.url, bytesize.Approx(got), bytesize.Approx(size)))
		} else {
			parts = append(parts, fmt.Sprintf("%s (%s so far)", p.url, bytesize.Approx(got)))
		}
	}
	if len(ps) > shown {
		parts = append(parts, fmt.Sprintf("and %d more", len(ps)-shown))
	}
	return len(ps), strings.Join(parts, ", ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
