package pacer_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// drainSpec is one drain of n URLs from one authority of a real stub
// origin, served over loopback HTTP, with the origin's limiter and the
// pacer both on one fake clock. The driver is a discrete-event loop: a
// request is granted and confirmed at a virtual instant, sent (the origin
// admits it at that instant), and its Done is delivered latency(i) later,
// so that, as in the worker, a response's headers reach the pacer only
// after its body was stored while other requests may start meanwhile.
type drainSpec struct {
	profile *stuborigin.Profile
	n       int
	floor   time.Duration
	flight  int
	// phase is the start's offset into the origin's fixed 10 s windows
	// (they are aligned on the epoch).
	phase   time.Duration
	latency func(i int) time.Duration
	limit   time.Duration // virtual time after which the drain gives up
}

type drainResult struct {
	stored, requests int
	throttled, early int64
	reasons          map[string]int64
	elapsed          time.Duration
	maxInFlight      int
	statuses         map[int]int
	// zeroes counts admitted answers that announced a quota at zero: the
	// budget run down, which pacing at the announced rate avoids.
	zeroes int
}

// drain runs d and returns what the origin saw. Nothing sleeps: the clock
// jumps to the next event.
func drain(t *testing.T, d drainSpec) drainResult {
	t.Helper()
	// 1_800_000_000 s is a multiple of 10 s: phase is the offset into the
	// origin's shard window.
	start := time.Unix(1_800_000_000, 0).Add(d.phase)
	fc := clock.NewFake(start)
	og, err := stuborigin.New(d.profile, &stuborigin.Options{Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	urls, err := og.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { og.Close() })
	u, _ := url.Parse(urls[0])
	auth := u.Host
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}

	p := pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: d.floor, MaxInFlight: d.flight}},
		Rand:       func() float64 { return 0 },
		StartGuard: -1,
	})
	type pending struct {
		pm     pacer.Permit
		status int
		header http.Header
		at     time.Time
	}
	var inflight []pending
	res := drainResult{statuses: map[int]int{}}
	queued := d.n // jobs not yet stored nor in flight
	for res.stored < d.n {
		now := fc.Now()
		if now.Sub(start) > d.limit {
			t.Fatalf("drain stuck: %d of %d stored after %v (virtual)", res.stored, d.n, d.limit)
		}
		// Deliver every Done that is due, oldest first.
		sort.Slice(inflight, func(i, j int) bool { return inflight[i].at.Before(inflight[j].at) })
		for len(inflight) > 0 && !inflight[0].at.After(now) {
			f := inflight[0]
			inflight = inflight[1:]
			p.Done(now, f.pm, pacer.Response{Status: f.status, Header: f.header})
			if f.status == http.StatusOK {
				res.stored++
			} else {
				queued++
			}
		}
		if res.stored == d.n {
			break
		}
		next := now.Add(time.Hour)
		for queued > 0 {
			pm, err := p.Acquire(now, auth, 0)
			if err != nil {
				var re *pacer.RefusedError
				if !errors.As(err, &re) {
					t.Fatal(err)
				}
				next = minTime(next, now.Add(max(re.Wait, time.Millisecond)))
				break
			}
			pm, err = p.Confirm(now, pm)
			if err != nil {
				p.Done(now, pm, pacer.Response{Cancelled: true})
				continue
			}
			if pm.Start.After(now) {
				// Spaced by Confirm: give it back and come back then.
				p.Done(now, pm, pacer.Response{Cancelled: true})
				next = minTime(next, pm.Start)
				break
			}
			queued--
			i := res.requests
			res.requests++
			r, err := hc.Get(urls[0] + "/f/" + strconv.Itoa(i))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			res.statuses[r.StatusCode]++
			if fb := pacer.ParseFeedback(r.StatusCode, r.Header, now); r.StatusCode == http.StatusOK && fb.Exhausted() {
				res.zeroes++
			}
			inflight = append(inflight, pending{pm: pm, status: r.StatusCode, header: r.Header, at: now.Add(d.latency(i))})
			res.maxInFlight = max(res.maxInFlight, len(inflight))
		}
		for _, f := range inflight {
			next = minTime(next, f.at)
		}
		if next.After(now) {
			fc.Advance(next.Sub(now))
		}
	}
	res.elapsed = fc.Now().Sub(start)
	a := og.Stats().Authorities[0]
	res.throttled = a.RateLimited + a.CapacityExhausted
	res.early = a.Early
	res.reasons = a.Reasons
	return res
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func loadProfile(t *testing.T, name string) *stuborigin.Profile {
	t.Helper()
	p, err := stuborigin.LoadProfile(filepath.Join("..", "testdata", "profiles", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A drain of 100 URLs from one authority of the real stub origin on the
// throttling profile, with the pacer at real constants and a 100 ms floor:
// no answer is throttled and no request comes before a deadline the origin
// announced, in every run, and the drain takes at most 1.1 times what the
// origin allows at all. Runs differ in where the start falls in the
// origin's fixed shard window and in how long each response takes to reach
// Done (up to 250 ms, so that requests overlap and readings arrive after
// later requests were sent). With IETF headers the origin announces its
// policies, and pacing at them keeps the budget from being run down: at
// most the last of a fixed window's share is spent to zero. X-RateLimit
// headers announce no window, so there the budget is run down to each
// reset, politely.
func TestDrainOnStubOriginNeverThrottled(t *testing.T) {
	const n = 100
	for _, family := range []string{stuborigin.HeadersIETF, stuborigin.HeadersXRateLimit} {
		prof := loadProfile(t, "throttling.json")
		prof.RateLimitHeaders = family
		// The origin admits at most its sustained capacity plus its
		// refill: 20 + 2/s * T by T, so 100 requests need T >= 40 s.
		q := prof.Quotas["anonymous"].Sustained
		best := time.Duration(float64(n-int(q.Capacity)) / prof.SustainedRate("anonymous") * float64(time.Second))
		for run := range 10 {
			t.Run(family+"/"+strconv.Itoa(run), func(t *testing.T) {
				r := drain(t, drainSpec{
					profile: prof, n: n, floor: 100 * time.Millisecond, flight: 2,
					phase:   time.Duration(run) * 1003 * time.Millisecond,
					latency: func(i int) time.Duration { return time.Duration((i*7919+run*104729)%250) * time.Millisecond },
					limit:   10 * time.Minute,
				})
				if r.throttled != 0 || r.early != 0 {
					t.Errorf("%d throttled (%v), %d early in %d requests; want none", r.throttled, r.reasons, r.early, r.requests)
				}
				if limit := best * 11 / 10; r.elapsed > limit {
					t.Errorf("drain took %v, want at most %v (1.1 x the %v the origin allows)", r.elapsed, limit, best)
				}
				if r.maxInFlight < 2 {
					t.Errorf("at most %d request out at a time: the run never overlapped requests", r.maxInFlight)
				}
				if family == stuborigin.HeadersIETF && r.zeroes > 2 {
					t.Errorf("%d answers announced a quota at zero: the budget was run down, not paced", r.zeroes)
				}
				t.Logf("%v, %d requests, %d answers at zero remaining, up to %d out", r.elapsed, r.requests, r.zeroes, r.maxInFlight)
			})
		}
	}
}
