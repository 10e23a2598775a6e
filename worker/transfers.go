package worker

import (
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
)

// transfers are the fetches in flight, kept so that status and
// /debug/pacer can say what a long download has done so far (a 500 MB
// body is otherwise only "1/2 in flight" for minutes). Safe for
// concurrent use.
type transfers struct {
	mu sync.Mutex
	m  map[*transfer]struct{}
}

// transfer is one fetch in flight. Its counters are written by the one
// goroutine that reads the body and read by Status at any time.
type transfer struct {
	url, target, auth string
	started           time.Time
	bodyAt            atomic.Int64 // unix nanoseconds when the headers arrived; 0 before
	expected          atomic.Int64 // -1: unknown
	bytes             atomic.Int64
}

// start registers a fetch of j starting at now; end removes it.
func (ts *transfers) start(j *heldJob, now time.Time) *transfer {
	t := &transfer{url: logURL(j.job.URL), target: j.job.Target, auth: j.auth, started: now}
	t.expected.Store(-1)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[*transfer]struct{}{}
	}
	ts.m[t] = struct{}{}
	return t
}

func (ts *transfers) end(t *transfer) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	delete(ts.m, t)
}

// body marks the headers' arrival at now, with the expected body size:
// the Content-Length header, else want (the job's size, -1: none).
func (t *transfer) body(now time.Time, contentLength string, want int64) {
	if n, err := strconv.ParseInt(contentLength, 10, 64); err == nil && n >= 0 {
		want = n
	}
	t.expected.Store(want)
	t.bodyAt.Store(now.UnixNano())
}

// snapshot is every fetch in flight at now, the longest running first.
func (ts *transfers) snapshot(now time.Time) []fetch.Progress {
	ts.mu.Lock()
	out := make([]fetch.Progress, 0, len(ts.m))
	for t := range ts.m {
		p := fetch.Progress{
			URL: t.url, Target: t.target, Authority: t.auth, Started: t.started.UTC(),
			Elapsed: now.Sub(t.started).Seconds(), Bytes: t.bytes.Load(), Expected: t.expected.Load(),
		}
		if at := t.bodyAt.Load(); at != 0 {
			if d := now.Sub(time.Unix(0, at)).Seconds(); d > 0 {
				p.Rate = float64(p.Bytes) / d
			}
		}
		out = append(out, p)
	}
	ts.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Started.Equal(out[j].Started) {
			return out[i].Started.Before(out[j].Started)
		}
		return out[i].URL < out[j].URL
	})
	return out
}
