package loadtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/strategy"
)

// CurlOptions configure the curl-retry reference client (strategy.CurlRetry).
type CurlOptions struct {
	// Retries is curl's --retry N; default strategy.DefaultCurlRetries.
	Retries int
	// Spacing, when set, is curl's --rate as a fixed spacing: at least this
	// long between two request starts of one client. Zero: none, as with
	// plain `curl --retry N`.
	Spacing time.Duration
}

// ModeReference is Result.Mode of the reference client: a loop in the
// load-test process, no queue, no worker.
const ModeReference = "reference"

// curlRun is the reference client's progress, read by the watch. Safe for
// concurrent use.
type curlRun struct {
	total                  int
	done, failed, requests atomic.Int64
}

func (c *curlRun) snap() queueSnap {
	left := int64(c.total) - c.done.Load() - c.failed.Load()
	return queueSnap{pending: uint64(max(left, 0)), dead: int(c.failed.Load()), deliveries: uint64(c.requests.Load())}
}

// curl runs the reference client: what `curl --retry N URL...` does, one
// process per authority fetching that authority's files one at a time
// (curl runs the URLs of one invocation one after another), each request on
// its own: a transient answer is retried after its Retry-After, or curl's
// own 1, 2, 4... s backoff, and nothing is learned for the next file. A
// file whose retries run out counts as a dead letter.
func (r *run) curl(ctx context.Context, res *Result) error {
	o := r.o
	retries := o.Curl.Retries
	if retries == 0 {
		retries = strategy.DefaultCurlRetries
	}
	lists := jobURLs(r.urls, spread(o.Jobs, len(r.urls), o.Skew), o.Profile.ObjectSize)
	c := &curlRun{total: o.Jobs}
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}

	m := r.startMeasure()
	cctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for a, list := range lists {
		u, err := url.Parse(r.urls[a])
		if err != nil {
			stop()
			return err
		}
		auth, err := authority.FromURL(u)
		if err != nil {
			stop()
			return err
		}
		wg.Go(func() { c.fetchAll(cctx, client, auth.String(), list, retries, o.Curl.Spacing, r.sent) })
	}
	read := func(context.Context) (queueSnap, error) { return c.snap(), nil }
	m.watch(ctx, read)
	stop()
	wg.Wait()
	m.finish(ctx, res, read, 0)
	return nil
}

// fetchAll fetches list one file at a time, as one curl invocation does.
func (c *curlRun) fetchAll(ctx context.Context, client *http.Client, auth string, list []string, retries int, spacing time.Duration, sent *departures) {
	var last time.Time
	for _, u := range list {
		for attempt := 0; ; attempt++ {
			if spacing > 0 && !last.IsZero() {
				if !sleepCtx(ctx, time.Until(last.Add(spacing))) {
					return
				}
			}
			last = time.Now()
			sent.Record(auth, last)
			c.requests.Add(1)
			status, h, err := get(ctx, client, u)
			if ctx.Err() != nil {
				return
			}
			if err == nil && status == http.StatusOK {
				c.done.Add(1)
				break
			}
			var retry bool
			var wait time.Duration
			if err != nil {
				// A timeout or a broken transfer: curl retries it as
				// transient, with its backoff.
				retry, wait = strategy.CurlRetryWait(http.StatusGatewayTimeout, nil, attempt, retries, time.Now())
			} else {
				retry, wait = strategy.CurlRetryWait(status, h, attempt, retries, time.Now())
			}
			if !retry {
				c.failed.Add(1)
				break
			}
			if !sleepCtx(ctx, wait) {
				return
			}
		}
	}
}

// get fetches u and reads its body whole; a 200 whose body is short is an
// error (curl's partial transfer, which it retries).
func get(ctx context.Context, client *http.Client, u string) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("User-Agent", "mirrorworker-loadtest-curl-retry")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("%s: %d of %d bytes", u, n, resp.ContentLength)
	}
	return resp.StatusCode, resp.Header, err
}

// sleepCtx waits d unless ctx ends first; false when it did.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
