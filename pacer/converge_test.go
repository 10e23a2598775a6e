package pacer_test

import (
	"cmp"
	"container/heap"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/stuborigin/limitreq"
)

const traceDrain = false

// event is a request reaching the origin (arrive) or its answer coming
// back; seq orders events at the same instant as they were made.
type event struct {
	at     time.Time
	seq    int
	pm     pacer.Permit
	job    *drainJob
	arrive bool
	ok     bool // an answer: admitted
	// known is whether a refusal had come back when the request left.
	known bool
}

type events []event

func (a events) Len() int { return len(a) }
func (a events) Less(i, j int) bool {
	if !a[i].at.Equal(a[j].at) {
		return a[i].at.Before(a[j].at)
	}
	return a[i].seq < a[j].seq
}
func (a events) Swap(i, j int) { a[i], a[j] = a[j], a[i] }
func (a *events) Push(x any)   { *a = append(*a, x.(event)) }
func (a *events) Pop() any {
	old := *a
	x := old[len(old)-1]
	*a = old[:len(old)-1]
	return x
}

// bucketDrain is what a simulated drain measured.
type bucketDrain struct {
	drain      time.Duration // until the last file was answered
	requests   int
	rejections int
	// failed is how many refusals the pacer read as failures, not
	// throttling (a 503 it took for an origin failing or one URL's); dead
	// is how many jobs they dead-lettered, their failure budget spent.
	failed, dead int
	early        int // requests sent while a Retry-After was in force, by the origin's clock
	// crossed is how many of the early ones left before any refusal had
	// come back: the request on its way beside the first refused one,
	// which nothing could have held (ADR 0029, "Requests that cross a
	// refusal"). Every other early request left once the authority was
	// known to throttle.
	crossed int
	minGap  time.Duration // the shortest gap between two requests at the origin
	// paces is the learned pace after each refusal (State.Pace), in order.
	paces []time.Duration
	// refusedAt is when each refusal reached the origin, from t0.
	refusedAt []time.Duration
	// starts is when each request started, from t0.
	starts []time.Duration
	// answerPaces is the learned pace after each admission's answer, in
	// order (State.Pace).
	answerPaces []time.Duration
}

// drainOptions are drainBucket's departures from a request that reaches
// the origin as it starts and is answered after a fixed latency.
type drainOptions struct {
	// lag, when positive, delays each request's arrival at the origin
	// after its start by a uniform draw in [0, lag), as a pod's requests
	// reach the stub late by a goroutine's scheduling and a write: two
	// requests in flight may arrive in the other order than they
	// started. The answer comes latency after the arrival.
	lag  time.Duration
	seed uint64
	// lagRequests, when positive, is how many requests from the first
	// are late by lag; the later ones arrive as they start (a spell of
	// load that passes).
	lagRequests int
	// quickRefusal answers a refusal this much sooner than an admission
	// (at most latency): a 429 has no body to send, a file has.
	quickRefusal time.Duration
}

// drainBudget is the jobs' failure budget in drainBucket, the worker's
// default (worker.DefaultFailureBudget): a job whose refusals the pacer
// read as failures this many times is dead-lettered.
const drainBudget = 10

// drainJob is one file's job in drainBucket.
type drainJob struct {
	url   string
	fails int       // refusals read as failures
	ready time.Time // not before: the job's own retry backoff after a failure
}

// drainPacer is the pacer the drains run: the worker's (sends awaited,
// the cold hold, no jitter) with limits l.
func drainPacer(l pacer.Limits) *pacer.Pacer {
	return pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: l}, Rand: fixedRand(0), AwaitSends: true, ColdHold: pacer.DefaultColdHold})
}

// checkHeld fails t where the drain broke what holds whatever the pace: a
// request sent while a Retry-After was in force after a refusal had come
// back, more than maxCrossed crossing the first refusal (sent before it came
// back), a limiter's refusal read as a failure, a job dead-lettered.
func (r bucketDrain) checkHeld(t *testing.T, maxCrossed int) {
	t.Helper()
	if told := r.early - r.crossed; told != 0 {
		t.Errorf("%d requests arrived while a Retry-After was in force, sent after a refusal had come back (want 0)", told)
	}
	if r.crossed > maxCrossed {
		t.Errorf("%d requests crossed the first refusal (want at most %d)", r.crossed, maxCrossed)
	}
	if r.failed != 0 || r.dead != 0 {
		t.Errorf("%d refusals read as failures, %d jobs dead-lettered (want 0 and 0: a limiter's refusal is throttling)", r.failed, r.dead)
	}
}

// checkSpentAfter fails t unless the first request at or after told (the
// probe after a cooldown) is followed by spent requests that each left as
// soon as the one before was answered (latency, and a millisecond of the
// virtual clock's slack): a spend waits for the crossing rule and for
// nothing else.
func (r bucketDrain) checkSpentAfter(t *testing.T, told time.Duration, spent int, latency time.Duration) {
	t.Helper()
	probe := -1
	for i, s := range r.starts {
		if s >= told {
			probe = i
			break
		}
	}
	if probe < 0 || probe+spent >= len(r.starts) {
		t.Fatalf("no probe and %d requests after %s", spent, told)
	}
	for i := probe + 1; i <= probe+spent; i++ {
		if gap := r.starts[i] - r.starts[i-1]; gap > latency+time.Millisecond {
			t.Errorf("request %d after the probe at %s left %s after the one before (want at most the answer's %s): starts %v",
				i-probe, r.starts[probe], gap, latency, r.starts[probe:probe+spent+1])
		}
	}
}

// drainBucket fetches files from one authority through p on a virtual clock, as the
// worker does (two in flight, every answer latency after the request, a
// refused job back when the pacer says), against nginx's limit_req
// (limitreq, burst + 1 after every pause) that refuses
// with 429 and a Retry-After, or with nginx's default, 503 without one
// (retryAfter 0), which starts no cooldown. A refusal the pacer reads as
// throttling defers its job (no failure budget spent); one it reads as a
// failure costs the job an attempt, retried after the job's own backoff (1 s
// doubling, no jitter) and dead-lettered at drainBudget, as the worker does.
func drainBucket(t *testing.T, p *pacer.Pacer, o *limitreq.Limiter, files int, retryAfter, latency time.Duration) bucketDrain {
	t.Helper()
	return drainBucketWith(t, p, o, files, retryAfter, latency, drainOptions{})
}

// drainBucketWith is drainBucket with the departures of do.
func drainBucketWith(t *testing.T, p *pacer.Pacer, o *limitreq.Limiter, files int, retryAfter, latency time.Duration, do drainOptions) bucketDrain {
	t.Helper()

	var (
		r       = bucketDrain{minGap: time.Hour}
		now     = t0
		pending events
		seq     int
		queue   []*drainJob // jobs not in flight and not done, in the order they came back
		left    = files     // jobs neither stored nor dead-lettered
		told    time.Time
		last    time.Time
		next    = t0 // when the pacer said to ask again
		refused bool // a refusal has come back
		rnd     = rand.New(rand.NewPCG(do.seed, 1))
	)
	for i := range files {
		queue = append(queue, &drainJob{url: fmt.Sprintf("/f/%d", i)})
	}
	// ready is the index in queue of the first job that may start at now,
	// or -1, and the earliest instant a held job may (zero: none held).
	ready := func() (int, time.Time) {
		var held time.Time
		for i, j := range queue {
			if !j.ready.After(now) {
				return i, time.Time{}
			}
			if held.IsZero() || j.ready.Before(held) {
				held = j.ready
			}
		}
		return -1, held
	}
	refuse := pacer.Response{Status: 503}
	if retryAfter > 0 {
		refuse = pacer.Response{Status: 429, Header: http.Header{"Retry-After": {fmt.Sprint(int(retryAfter / time.Second))}}}
	}
	push := func(ev event) {
		seq++
		ev.seq = seq
		heap.Push(&pending, ev)
	}
	// arrive is the origin's side of a request reaching it at at.
	arrive := func(at time.Time, pm pacer.Permit, j *drainJob, known bool) {
		if at.Before(told) {
			r.early++
			if !known {
				r.crossed++
			}
			if traceDrain {
				t.Logf("TRACE %6.3fs early, told until %.3fs, a refusal known %v", at.Sub(t0).Seconds(), told.Sub(t0).Seconds(), known)
			}
		}
		if !last.IsZero() {
			r.minGap = min(r.minGap, at.Sub(last))
		}
		last = at
		// The origin times its Retry-After from the refusal, as
		// the stub does: a request already on its way when the
		// refusal left (two in flight) is early by its account.
		ok := o.Admit(at)
		if !ok {
			r.refusedAt = append(r.refusedAt, at.Sub(t0))
			if retryAfter > 0 && at.Add(retryAfter).After(told) {
				told = at.Add(retryAfter)
			}
		}
		back := latency
		if !ok {
			back = max(0, latency-do.quickRefusal)
		}
		push(event{at: at.Add(back), pm: pm, job: j, ok: ok})
	}
	for left > 0 {
		if r.requests > 100*files {
			t.Fatalf("%d requests for %d files: no progress", r.requests, files)
		}
		i, held := ready()
		if i >= 0 && !next.After(now) {
			pm, err := p.Acquire(now, host, 0)
			if err == nil {
				pm, err = p.Confirm(now, pm)
			}
			if err == nil && pm.Start.After(now) {
				p.Done(now, pm, pacer.Response{Cancelled: true})
				next = pm.Start
				continue
			}
			if re, ok := err.(*pacer.RefusedError); ok {
				next = now.Add(re.Wait)
			} else if err != nil {
				t.Fatal(err)
			} else {
				j := queue[i]
				queue = append(queue[:i], queue[i+1:]...)
				r.requests++
				r.starts = append(r.starts, now.Sub(t0))
				if traceDrain && r.requests < 60 {
					t.Logf("TRACE %6.3fs req %d %s", now.Sub(t0).Seconds(), r.requests, j.url)
				}
				p.Sent(now, pm)
				if do.lag > 0 && (do.lagRequests <= 0 || r.requests <= do.lagRequests) {
					push(event{at: now.Add(time.Duration(rnd.Int64N(int64(do.lag)))), pm: pm, job: j, arrive: true, known: refused})
				} else {
					arrive(now, pm, j, refused)
				}
				continue
			}
		}
		// Nothing can start now: the next event is an arrival, an answer,
		// the wait's end, or a held job's retry.
		wake := next
		switch {
		case i < 0 && held.IsZero():
			wake = time.Time{} // no job to start until an answer
		case i < 0 && held.After(wake):
			wake = held
		}
		if len(pending) > 0 && (wake.IsZero() || !pending[0].at.After(wake)) {
			a := heap.Pop(&pending).(event)
			now = a.at
			if a.arrive {
				arrive(a.at, a.pm, a.job, a.known)
				continue
			}
			next = now // an answer wakes the jobs the in-flight cap held back
			if a.ok {
				left--
				p.Done(now, a.pm, pacer.Response{Status: 200, URL: a.job.url})
				r.drain = now.Sub(t0)
				r.answerPaces = append(r.answerPaces, time.Duration(p.Snapshot(now)[0].Pace))
				if traceDrain && left%20 == 0 {
					st := p.Snapshot(now)[0]
					t.Logf("TRACE %6.2fs left %d interval %s", now.Sub(t0).Seconds(), left, st.Interval)
				}
				continue
			}
			r.rejections++
			refused = true
			rf := refuse
			rf.URL = a.job.url
			v := p.Done(now, a.pm, rf)
			st := p.Snapshot(now)[0]
			r.paces = append(r.paces, time.Duration(st.Pace))
			if traceDrain {
				t.Logf("TRACE %6.3fs %d %s throttled %v left %d interval %s pace %s state %s", now.Sub(t0).Seconds(), rf.Status, a.job.url, v.Throttled, left, st.Interval, st.Pace, st.State)
			}
			if v.Throttled {
				queue = append(queue, a.job) // deferred: no attempt spent
				continue
			}
			r.failed++
			if a.job.fails++; a.job.fails >= drainBudget {
				r.dead++
				left--
				r.drain = now.Sub(t0)
				continue
			}
			a.job.ready = now.Add(time.Second << (a.job.fails - 1))
			queue = append(queue, a.job)
			continue
		}
		if wake.IsZero() {
			t.Fatalf("at %s: no answer pending and no job to start, %d left", now.Sub(t0), left)
		}
		now = wake
	}
	return r
}

// TestConvergesToTheOriginsRate drains 300 files from a leaky bucket (burst
// 5, nodelay, 429 with Retry-After 2 s) at 2 and 10 requests per second,
// with floors of 0, 100 ms and 1 s, and reports the drain against the
// origin's own bound (files / rate, or files x floor where the floor is the
// slower) and the rejections. ADR 0029 records the numbers.
func TestConvergesToTheOriginsRate(t *testing.T) {
	const files = 300
	tests := []struct {
		rate      float64
		floor     time.Duration
		firstStep time.Duration // Limits.FirstStep; 0 is the contract's 2 s
		latency   time.Duration // of every answer; 0 is 20 ms
		maxRatio  float64       // drain / bound
		maxRej    int
		// maxCrossed is how many requests may arrive inside a
		// Retry-After having left before any refusal came back: at floor
		// 0 the cold blast had two in flight, and the one beside the
		// first refused request crossed its refusal; the cold hold
		// sends it one at a time (the fifteenth look). Once a refusal
		// has come back, none may (two in flight or not): that is
		// asserted for every row.
		maxCrossed int
		limiter    bool // 503 without Retry-After instead of 429 + Retry-After: 2
	}{
		// The benchmark's bar is 1.1 and 2% (6 of 300).
		{2, 0, 0, 0, 1.1, 6, 0, false},
		{2, 0, 0, time.Millisecond, 1.1, 6, 0, false},
		{2, 100 * time.Millisecond, 0, 0, 1.1, 6, 0, false},
		{2, time.Second, 0, 0, 1.05, 0, 0, false},
		// Short of the bar: a client that does not know the rate needs
		// two refusals, one to find the limit and its burst, one to read
		// its rate. The first costs the 2 s Retry-After and the 2 s first
		// step after the probe (nothing is known yet); the second, once
		// the ramp's refusal has read a pace, twice that pace and what
		// the bucket needs to drain (ADR 0029, the sixth look: 1.23x
		// here, 1.29x when it too stepped 2 s). Against nginx's own
		// arithmetic (limitreq) this settled at 1.29x with 3
		// rejections (the blast's two, one signal, and the ramp's) at 1,
		// 2, 20 and 30 ms answers alike. At a pod's 1 to 2 ms it took a
		// third refusal (1.39x with 4) while the ramp halved per answer:
		// the spacing fell from 62 to 2 ms in five requests, and the
		// ramp's refusal read the rate only to a factor of two (8.1 to
		// 16.2 r/s), whose middle was fast. The ramp now holds each level
		// below rampHalving for that long, and reads it to about 10%. At
		// 20 ms the crossing rule held the ramp at 40 ms, which did as
		// much, and a loose reading's creep stops short of its upper
		// bound (1.397x with 4 when it crept past it). At 30 ms the stop
		// holds the pace long enough to fill the reading's window: the
		// next reading keeps the bound before (1.50x with 5 rejections
		// when it read none and crept past the rate again). An
		// operator's first step of 100 ms settles at about 1.15x. The
		// blast's refusal now steps to the cooldown over the blast's
		// depth (333 ms here) instead of 2 s (the seventh look): the
		// first silence costs about 2 s instead of 5.9 s, 1.13-1.14x
		// at every latency (1.23x before, and these rows fail). The
		// bucket that the second cooldown drained is now spent back
		// before the pace holds (the eighth look): 1.121-1.130x
		// (1.134-1.140x without, and these rows fail); from the
		// probe's answer since the thirteenth look, 1.117-1.127x
		// (TestTheDepthIsSpentFromTheProbe). The cold hold (the
		// fifteenth look) sends the blast one request a round trip: at
		// 20 ms its leak is taken off the depth (reading.unleak,
		// 1.124 -> 1.095x). At 30 ms the bucket leaks 0.3 requests a
		// round trip and the blast counts 8 for a depth of 6: corrected
		// at the ramp's lower bound it stayed 7, the pace was read
		// 125 ms and the drain took 1.304x; corrected at its upper
		// bound it is 6, 1.118x (1.127x without the hold).
		{10, 0, 0, 0, 1.133, 6, 0, false},
		{10, 0, 0, time.Millisecond, 1.133, 6, 0, false},
		{10, 0, 0, 2 * time.Millisecond, 1.133, 6, 0, false},
		{10, 0, 0, 30 * time.Millisecond, 1.133, 6, 0, false},
		{10, 0, 100 * time.Millisecond, 0, 1.2, 6, 0, false},
		{10, 100 * time.Millisecond, 0, 0, 1.05, 0, 0, false},
		{10, time.Second, 0, 0, 1.05, 0, 0, false},
		// nginx's default refusal, 503 without Retry-After: throttling
		// without a cooldown (a limiter's 503, backoff.go); nothing is
		// early without a Retry-After.
		{2, 0, 0, 0, 1.1, 6, 0, true},
		{10, 0, 0, 0, 1.15, 6, 0, true},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%gr/s_floor%s_step%s", tt.rate, tt.floor, tt.firstStep)
		latency := cmp.Or(tt.latency, 20*time.Millisecond)
		if tt.latency != 0 {
			name += "_latency" + tt.latency.String()
		}
		ra := 2 * time.Second
		if tt.limiter {
			name, ra = name+"_503", 0
		}
		t.Run(name, func(t *testing.T) {
			p := drainPacer(pacer.Limits{Floor: tt.floor, MaxInFlight: 2, FirstStep: tt.firstStep})
			r := drainBucket(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: tt.rate, Burst: 5}}, files, ra, latency)
			bound := time.Duration(float64(files) / tt.rate * float64(time.Second))
			if f := time.Duration(files) * tt.floor; f > bound {
				bound = f
			}
			ratio := r.drain.Seconds() / bound.Seconds()
			t.Logf("drain %.1fs, bound %s, ratio %.3f, %d requests, %d rejections (%.1f%%), %d early (%d crossing the first refusal), closest gap %s, %d failed, %d dead",
				r.drain.Seconds(), bound, ratio, r.requests, r.rejections, 100*float64(r.rejections)/float64(r.requests), r.early, r.crossed, r.minGap, r.failed, r.dead)
			r.checkHeld(t, tt.maxCrossed)
			if r.minGap < tt.floor {
				t.Errorf("closest gap %s, below the floor %s", r.minGap, tt.floor)
			}
			if ratio > tt.maxRatio || r.rejections > tt.maxRej {
				t.Errorf("drain ratio %.3f (want at most %.2f), %d rejections (want at most %d)", ratio, tt.maxRatio, r.rejections, tt.maxRej)
			}
		})
	}
}

// TestTheDepthIsSpentFromTheProbe drains the 10 r/s rows of
// TestConvergesToTheOriginsRate (burst 5, Retry-After 2 s, floor 0) and
// checks what follows the probe after the ramp's refusal, whose reading is
// tight and whose cooldown drained the bucket: the depth less
// spendHeadroom (4 requests) goes at once after the probe, each as soon
// as the one before is answered. Before, the request after the probe left
// at the escalated interval (twice the pace, 205 ms) into a bucket
// already empty, and the spend followed its answer (ADR 0029, the
// thirteenth look).
func TestTheDepthIsSpentFromTheProbe(t *testing.T) {
	const (
		files = 300
		ra    = 2 * time.Second
		spent = 4 // the depth (nginx's burst 5, plus one) less spendHeadroom
	)
	// At 30 ms the cold hold's blast counts 8 for a depth of 6 and its
	// refusal steps 2 s / 8 (250 ms, not 333 ms). Without the spend after
	// the blast's probe the ramp's levels fell on 31 ms, refused after
	// five, and the reading's bounds (8.9 to 10.1 r/s) were not tight, so
	// nothing was spent here (ADR 0029, the fifteenth look); with it the
	// ramp is refused at 62 ms and the reading is tight (the sixteenth
	// look).
	for _, latency := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			p := drainPacer(pacer.Limits{MaxInFlight: 2})
			r := drainBucket(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: 10, Burst: 5}}, files, ra, latency)
			t.Logf("ratio %.3f, %d rejections, refused at %v", r.drain.Seconds()/30, r.rejections, r.refusedAt)
			if len(r.refusedAt) == 0 || r.refusedAt[len(r.refusedAt)-1] < time.Second {
				t.Fatalf("refused at %v: no refusal after the cold blast's", r.refusedAt)
			}
			r.checkSpentAfter(t, r.refusedAt[len(r.refusedAt)-1]+ra, spent, latency)
			r.checkHeld(t, 0)
			if r.rejections > 3 {
				t.Errorf("%d rejections (want at most 3: the blast's, and the ramp's)", r.rejections)
			}
		})
	}
}

// TestTheColdBlastsDepthIsSpentFromTheProbe drains the 10 r/s rows of
// TestConvergesToTheOriginsRate (burst 5, Retry-After 2 s, floor 0) and
// checks what follows the probe after the cold blast's cooldown: the
// blast's refusal stepped the interval to the cooldown over the depth it
// read (the seventh look), which assumes an origin that drains that depth
// within the cooldown, so the bucket is empty at the probe, and half of
// what a later cooldown spends (2 of a depth of 6 or 7) goes at once after
// it, each request as soon as the one before is answered. Before, the ramp
// went on from the probe at the step (333 ms at a depth of 6), then half of
// it, while the bucket sat empty: 1.117-1.118x at 1, 2 and 30 ms answers
// (ADR 0029, the sixteenth look).
func TestTheColdBlastsDepthIsSpentFromTheProbe(t *testing.T) {
	const (
		files = 300
		ra    = 2 * time.Second
		spent = 2 // half the depth (nginx's burst 5, plus one) less spendHeadroom
	)
	for _, latency := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			p := drainPacer(pacer.Limits{MaxInFlight: 2})
			r := drainBucket(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: 10, Burst: 5}}, files, ra, latency)
			ratio := r.drain.Seconds() / 30
			t.Logf("ratio %.3f, %d rejections, refused at %v", ratio, r.rejections, r.refusedAt)
			if len(r.refusedAt) == 0 {
				t.Fatal("no refusal")
			}
			r.checkSpentAfter(t, r.refusedAt[0]+ra, spent, latency)
			r.checkHeld(t, 0)
			if r.rejections > 2 {
				t.Errorf("%d rejections (want at most 2: the blast's, and the ramp's)", r.rejections)
			}
			if ratio > 1.1 {
				t.Errorf("drain ratio %.3f (want at most 1.1)", ratio)
			}
		})
	}
}

// TestConvergenceSweep drains 300 files at floor 0 from limiters of
// 0.5 to 50 r/s, bursts 0 (nginx's default: limit_req without burst=), 5
// and 10, refusing with 429 and a Retry-After of 1 s or 2 s, or with 503
// and none (ADR 0029, the seventh look; ADR 0030), and logs each cell's
// ratio and rejections. Every cell asserts that nothing leaves inside a
// Retry-After once a refusal came back, that no request crosses the first
// (the cold hold sends the blast one at a time; without it the request
// beside the refused one crossed in every cell with a Retry-After), and
// that no refusal is read as a failure (so no job is dead-lettered): a
// limiter's 503 is throttling. At 50 r/s one request may cross: a blast
// one round trip (20 ms) apart is the origin's own rate, nothing is
// refused during the hold, and the first refusal is that of the blast at
// full speed after it (ADR 0029, the fifteenth look).
func TestConvergenceSweep(t *testing.T) {
	const files = 300
	for _, ra := range []time.Duration{time.Second, 2 * time.Second, 0} {
		for _, burst := range []int64{0, 5, 10} {
			for _, rate := range []float64{0.5, 1, 2, 5, 10, 20, 50} {
				t.Run(fmt.Sprintf("ra%s_burst%d_%gr/s", ra, burst, rate), func(t *testing.T) {
					p := drainPacer(pacer.Limits{MaxInFlight: 2})
					r := drainBucket(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: rate, Burst: burst}}, files, ra, 20*time.Millisecond)
					bound := float64(files) / rate
					ratio := r.drain.Seconds() / bound
					t.Logf("SWEEP ra %s burst %d rate %g: ratio %.3f, %d rejections of %d, %d early (%d crossing), %d failed, %d dead", ra, burst, rate, ratio, r.rejections, r.requests, r.early, r.crossed, r.failed, r.dead)
					crossed := 0
					if rate >= 50 {
						crossed = 1
					}
					r.checkHeld(t, crossed)
				})
			}
		}
	}
}

// TestARefusedPaceSlowsDown drains 300 files where the pace read from the
// origin comes out faster than its rate, and asserts that the origin's
// refusal of it is not lost: after a refusal that leaves a pace faster than
// the rate, at most one refusal more, and the pace after that one at or
// under the rate (ADR 0029, the tenth look). Before, the same fast pace
// came back after every refusal, each a Retry-After apart: a pod at 10 r/s
// was refused every 8.3-8.7 s for the rest of its run (1.27-1.29x).
func TestARefusedPaceSlowsDown(t *testing.T) {
	const files = 300
	tests := []struct {
		name    string
		rate    float64
		burst   int64 // nginx's burst=; the bucket's depth is one more
		latency time.Duration
		do      drainOptions
	}{
		// A depth of 5 is odd: the blast's last pair is granted at one
		// instant, the origin admits the first and refuses the second,
		// and the refusal, which has no body, is answered first. The
		// blast counted only the admissions started before the refused
		// request, and read a depth of 4 (a pod read 5 for 6 in 2 runs
		// of 12 the same way: the admitted one overtook it on its way).
		{"blast_sibling_answered_after_refusal_10r/s", 10, 4, 20 * time.Millisecond, drainOptions{quickRefusal: 10 * time.Millisecond}},
		{"blast_sibling_answered_after_refusal_5r/s", 5, 4, 20 * time.Millisecond, drainOptions{quickRefusal: 10 * time.Millisecond}},
		{"blast_sibling_answered_after_refusal_20r/s", 20, 4, 20 * time.Millisecond, drainOptions{quickRefusal: 10 * time.Millisecond}},
		// A pod's requests reach the origin late by its scheduling and
		// write: the reading's starts are not the origin's arrivals, and
		// in these seeds of 48 the blast or the ramp read the rate fast.
		{"arrivals_late_by_up_to_2ms_seed5", 10, 5, time.Millisecond, drainOptions{lag: 2 * time.Millisecond, seed: 5, quickRefusal: 500 * time.Microsecond}},
		{"arrivals_late_by_up_to_5ms_seed8", 10, 5, time.Millisecond, drainOptions{lag: 5 * time.Millisecond, seed: 8, quickRefusal: 500 * time.Microsecond}},
		{"arrivals_late_by_up_to_10ms_seed8", 10, 5, 2 * time.Millisecond, drainOptions{lag: 10 * time.Millisecond, seed: 8, quickRefusal: time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := drainPacer(pacer.Limits{MaxInFlight: 2})
			r := drainBucketWith(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: tt.rate, Burst: tt.burst}}, files, 2*time.Second, tt.latency, tt.do)
			spacing := time.Duration(float64(time.Second) / tt.rate)
			t.Logf("ratio %.3f, %d rejections of %d, paces after each %v, refused at %v",
				r.drain.Seconds()*tt.rate/files, r.rejections, r.requests, r.paces, r.refusedAt)
			for i, pc := range r.paces {
				if pc == 0 || pc >= spacing {
					continue
				}
				switch after := r.paces[i+1:]; {
				case len(after) > 1:
					t.Errorf("refusal %d left a pace of %s, faster than the origin's %s, and %d refusals followed (want at most 1): paces %v",
						i+1, pc, spacing, len(after), r.paces)
				case len(after) == 1 && after[0] < spacing:
					t.Errorf("refusal %d left a pace of %s, faster than the origin's %s, and the refusal after it %s (want at or under the rate)",
						i+1, pc, spacing, after[0])
				}
			}
			r.checkHeld(t, 1)
			if r.rejections > files/50 {
				t.Errorf("%d rejections (want at most %d, 2%%)", r.rejections, files/50)
			}
		})
	}
}

// TestALimiterSettles drains 300 files at floor 0 from limiters where
// few answers come back between two refusals, or where nothing absorbs a
// pace a little fast, and asserts that the drain settles: at most 2% of
// the requests refused and the drain within maxRatio of the origin's bound.
//
// Slower than the contract's 2 s first step: nginx's default 503 without
// Retry-After (no cooldown) at burst 0 and 5, and a 429 whose 1 s
// Retry-After is shorter than the origin's spacing. Before, no pace was
// read from the ramp's refusals (fewer than minPaceAnswers answers between
// them), and the interval went 2 s, 1 s, refused, 2 s: 299 of 599 requests
// refused at burst 0, 178 of 478 at burst 5, 151 of 451 with the 1 s
// Retry-After.
//
// Without burst= (a bucket of depth 1): the pace read from whole-millisecond
// admissions was up to 1% faster than the rate (99.3 ms at 10 r/s), refused
// at once, and doubled: 1.90x at 1 r/s, 2.43x at 10 r/s with RA 2 s. The
// start at 10 r/s (the blast's step is the whole Retry-After at depth 1)
// still costs most of the rest (ADR 0029, the twelfth look).
//
// The quick rows answer a refusal 10 ms sooner than a file, as a pod reads
// the stub's 503 (no body) before the 200 beside it: the cold blast's only
// admission came back after its refusal, the depth was not counted, the
// pace at 2 r/s was read 499.1 ms, refused and doubled to 998 ms for the
// rest of the run (1.90x with a refusal read as a failure; a traced pods
// run drew 12 refusals this way: ADR 0029, the twelfth look).
func TestALimiterSettles(t *testing.T) {
	const files = 300
	tests := []struct {
		name       string
		rate       float64
		burst      int64
		retryAfter time.Duration // 0: 503 without Retry-After
		maxRatio   float64
		do         drainOptions
	}{
		{"503_burst0_0.5r/s", 0.5, 0, 0, 1.05, drainOptions{}},
		{"503_burst5_0.5r/s", 0.5, 5, 0, 1.05, drainOptions{}},
		{"429_ra1s_burst0_0.5r/s", 0.5, 0, time.Second, 1.05, drainOptions{}},
		{"503_burst0_1r/s", 1, 0, 0, 1.05, drainOptions{}},
		{"503_burst0_2r/s", 2, 0, 0, 1.1, drainOptions{}},
		{"503_burst0_1r/s_quick_refusal", 1, 0, 0, 1.05, drainOptions{quickRefusal: 10 * time.Millisecond}},
		{"503_burst0_2r/s_quick_refusal", 2, 0, 0, 1.1, drainOptions{quickRefusal: 10 * time.Millisecond}},
		{"503_burst0_10r/s_quick_refusal", 10, 0, 0, 1.6, drainOptions{quickRefusal: 10 * time.Millisecond}},
		{"429_ra2s_burst0_2r/s_quick_refusal", 2, 0, 2 * time.Second, 1.1, drainOptions{quickRefusal: 10 * time.Millisecond}},
		{"429_ra2s_burst0_10r/s", 10, 0, 2 * time.Second, 1.6, drainOptions{}},
		{"429_ra2s_burst0_10r/s_quick_refusal", 10, 0, 2 * time.Second, 1.6, drainOptions{quickRefusal: 10 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := drainPacer(pacer.Limits{MaxInFlight: 2})
			r := drainBucketWith(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: tt.rate, Burst: tt.burst}}, files, tt.retryAfter, 20*time.Millisecond, tt.do)
			ratio := r.drain.Seconds() * tt.rate / files
			paces := r.paces
			if len(paces) > 8 {
				paces = paces[len(paces)-8:]
			}
			t.Logf("ratio %.3f, %d rejections of %d, paces after the last %d %v", ratio, r.rejections, r.requests, len(paces), paces)
			if r.rejections > r.requests/50 {
				t.Errorf("%d rejections of %d requests (want at most 2%%)", r.rejections, r.requests)
			}
			if ratio > tt.maxRatio {
				t.Errorf("drain ratio %.3f (want at most %.2f)", ratio, tt.maxRatio)
			}
			r.checkHeld(t, 1)
		})
	}
}

// TestADepthOnePaceCoversItsJitter drains 300 files at floor 0 from
// nginx's default limiter (no burst=: a bucket of depth 1) at 2, 10 and 20
// r/s, refusing with 503 and no Retry-After or with 429 and a Retry-After of
// 2 s, while each request reaches the origin late after its start by up to
// 0, 2, 5 or 10 ms (drainOptions.lag, four seeds each). Such a bucket admits
// a request only a whole 1/rate after the last admitted one by its own
// clock: any two arrivals closer than the starts they left at is a refusal,
// whatever the mean pace. Before, the pace held a tick above the rate was
// refused by the jitter and doubled, or read again from admissions as
// jittered and came out slower: a 503 limiter drained in up to 1.99x at
// 2 r/s (5 and 10 ms of lag) and 2.03x at 10 r/s (2 ms) (ADR 0029, the
// thirteenth look).
//
// The drain with lag is held against the same cell without it (the start,
// which lag does not change much, costs most of a 10 or 20 r/s drain:
// the twelfth look): at most 3 refusals more (the margin's steps, 1, 3,
// 7, 15 ms), and a ratio at most 5% of the bound above it plus the lag's
// own share of the spacing (lag × rate: a pace that covers arrivals up to
// lag apart is that much slower) plus, for each refusal more, the
// Retry-After and two paces it costs. One refusal more is allowed for a
// narrowing of the margin the jitter refused (marginCalm answers after the
// last widening: at most one in 300 files). (The lag's share was left out while
// the cell without lag paid 2 s more at its start than the cells with it,
// the crossing sibling's second escalation: ADR 0029, the thirteenth look,
// "The crossing sibling".)
func TestADepthOnePaceCoversItsJitter(t *testing.T) {
	const files = 300
	for _, ra := range []time.Duration{0, 2 * time.Second} {
		for _, rate := range []float64{2, 10, 20} {
			drain := func(t *testing.T, lag time.Duration, seed uint64) bucketDrain {
				p := drainPacer(pacer.Limits{MaxInFlight: 2})
				return drainBucketWith(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: rate}}, files, ra, 20*time.Millisecond, drainOptions{lag: lag, seed: seed})
			}
			base := drain(t, 0, 0)
			baseRatio := base.drain.Seconds() * rate / files
			kind := "503"
			if ra > 0 {
				kind = "429_ra" + ra.String()
			}
			t.Logf("JITTER %s %g r/s lag 0: ratio %.3f, %d rejections of %d, paces %v", kind, rate, baseRatio, base.rejections, base.requests, base.paces)
			perRefusal := (ra.Seconds() + 2/rate) * rate / files
			spacing := time.Duration(float64(time.Second) / rate)
			for _, lag := range []time.Duration{2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond} {
				for seed := uint64(1); seed <= 4; seed++ {
					t.Run(fmt.Sprintf("%s_%gr/s_lag%s_seed%d", kind, rate, lag, seed), func(t *testing.T) {
						r := drain(t, lag, seed)
						ratio := r.drain.Seconds() * rate / files
						t.Logf("JITTER %s %g r/s lag %s seed %d: ratio %.3f, %d rejections of %d, paces %v", kind, rate, lag, seed, ratio, r.rejections, r.requests, r.paces)
						more := max(0, r.rejections-base.rejections)
						if more > 4 {
							t.Errorf("%d rejections, %d without lag (want at most 4 more)", r.rejections, base.rejections)
						}
						most := baseRatio + 0.05 + lag.Seconds()*rate + float64(more)*perRefusal
						// The first pace learned: after the blast's refusal
						// (and its crossing sibling's, without the cold hold).
						var first time.Duration
						for _, pc := range r.paces {
							if pc > 0 {
								first = pc
								break
							}
						}
						if ramped := first >= 2*spacing; ramped {
							// Left (ADR 0029, the thirteenth look): at
							// 2 r/s the ramp's level of 500 ms is the
							// rate itself, the jitter refused it before
							// any pace was learned, and the ramp's rule
							// (the twelfth look) learned the level
							// above, 1 s, from which the loose creep
							// takes about 70 s back.
							most += 0.1
							t.Logf("the ramp's level at the rate refused: pace %s for %s", first, spacing)
						}
						if ratio > most {
							t.Errorf("drain ratio %.3f, %.3f without lag (want at most %.3f: 5%%, the lag's share and %d refusals more)", ratio, baseRatio, most, more)
						}
						r.checkHeld(t, 1)
					})
				}
			}
		}
	}
}

// TestADepthOneMarginNarrows drains 1500 files from nginx's default limiter
// (depth 1) at 10 and 20 r/s, 503 or 429 with a Retry-After of 2 s, while
// the first 200 requests reach the origin late by up to 10 ms (a spell of
// load on the pod, then none). The refusals that the late arrivals drew
// widened the depth-1 pace's margin (jitterLocked); before, it never
// narrowed, and the pace stayed up to 20% slow for the authority's life
// (the reading from those arrivals, 4-12% slow, with it). Now the margin
// halves back after marginCalm answers without a refusal, and once back at
// the tick the reading is loosened once, so the creep reads the rate again
// (ADR 0029, the thirteenth look, "The margin narrows"). The pace must be
// back within 1 ms of the drain's without lag (its last pace) from answer
// 1000 on, with at most 2% of requests refused and at most 4 refusals more
// than the drain without lag has plus the spell's own (the margin's
// widenings counted in the first 300 answers).
func TestADepthOneMarginNarrows(t *testing.T) {
	const files, spell, back = 1500, 200, 1000
	for _, ra := range []time.Duration{0, 2 * time.Second} {
		for _, rate := range []float64{10, 20} {
			drain := func(t *testing.T, lag time.Duration, seed uint64) bucketDrain {
				p := drainPacer(pacer.Limits{MaxInFlight: 2})
				return drainBucketWith(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: rate}}, files, ra, 20*time.Millisecond, drainOptions{lag: lag, seed: seed, lagRequests: spell})
			}
			base := drain(t, 0, 0)
			basePace := base.answerPaces[len(base.answerPaces)-1]
			kind := "503"
			if ra > 0 {
				kind = "429_ra" + ra.String()
			}
			for seed := uint64(1); seed <= 4; seed++ {
				t.Run(fmt.Sprintf("%s_%gr/s_seed%d", kind, rate, seed), func(t *testing.T) {
					r := drain(t, 10*time.Millisecond, seed)
					ratio := r.drain.Seconds() * rate / files
					spellRefusals := 0
					for _, at := range r.refusedAt {
						if at.Seconds()*rate <= 300 {
							spellRefusals++
						}
					}
					worst := time.Duration(0)
					for _, pc := range r.answerPaces[back:] {
						worst = max(worst, pc)
					}
					t.Logf("NARROW %s %g r/s seed %d: ratio %.3f (%.3f without lag), %d rejections of %d (%d without lag, %d in the spell), paces %v, the pace from answer %d at most %s (%s without lag)",
						kind, rate, seed, ratio, base.drain.Seconds()*rate/files, r.rejections, r.requests, base.rejections, spellRefusals, r.paces, back, worst, basePace)
					if worst > basePace+time.Millisecond {
						t.Errorf("pace %s after answer %d, %s without lag (want within 1ms)", worst, back, basePace)
					}
					if float64(r.rejections) > 0.02*float64(r.requests) {
						t.Errorf("%d rejections of %d requests (want at most 2%%)", r.rejections, r.requests)
					}
					if r.rejections > base.rejections+spellRefusals+4 {
						t.Errorf("%d rejections, %d without lag and %d in the spell (want at most 4 more)", r.rejections, base.rejections, spellRefusals)
					}
					r.checkHeld(t, 1)
				})
			}
		}
	}
}

// TestALimitersRefusalStepsHalfADrain drains 300 files at floor 0 from
// nginx's default refusal, 503 without Retry-After (no cooldown), burst 5,
// at 5, 10 and 20 r/s, and checks the silence after the ramp's refusal (the
// first one after the cold blast's): the next request leaves within about
// half the time the bucket takes to drain (its depth and the probe at the
// rate; the bound is 0.9 of the whole drain, as the step is half the drain
// at the reading's lower bound, 15 r/s for 20 here: 232 ms of a 300 ms
// drain). Before, the step was the whole drain, sized for
// the spend that follows a Retry-After; without one nothing spent the
// drained depth back, and 10 r/s left 787 ms idle after the refusal, 5 r/s
// 1.42 s, 20 r/s 464 ms (ADR
// 0029, the fourteenth look).
func TestALimitersRefusalStepsHalfADrain(t *testing.T) {
	const (
		files = 300
		burst = 5
	)
	for _, rate := range []float64{5, 10, 20} {
		t.Run(fmt.Sprintf("%gr/s", rate), func(t *testing.T) {
			p := drainPacer(pacer.Limits{MaxInFlight: 2})
			r := drainBucket(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: rate, Burst: burst}}, files, 0, 20*time.Millisecond)
			drain := time.Duration(float64(burst+1) / rate * float64(time.Second))
			var ramp time.Duration
			for _, at := range r.refusedAt {
				if at > time.Second {
					ramp = at
					break
				}
			}
			if ramp == 0 {
				t.Fatalf("refused at %v: no refusal after the cold blast's", r.refusedAt)
			}
			next := time.Duration(-1)
			for _, s := range r.starts {
				if s > ramp {
					next = s
					break
				}
			}
			t.Logf("ratio %.3f, %d rejections, refused at %v, next request %v after the ramp's refusal (a whole drain %v)",
				r.drain.Seconds()*rate/files, r.rejections, r.refusedAt, next-ramp, drain)
			if next < 0 {
				t.Fatalf("no request after the ramp's refusal at %v", ramp)
			}
			if gap := next - ramp; gap > drain*9/10 {
				t.Errorf("the next request left %v after the ramp's refusal (want at most %v, 0.9 of the bucket's drain %v at the rate)", gap, drain*9/10, drain)
			}
			r.checkHeld(t, 1)
			if r.rejections > files/50 {
				t.Errorf("%d rejections (want at most %d, 2%%)", r.rejections, files/50)
			}
		})
	}
}

// TestThePaceAfterTheRampAtEveryPhase drains 300 files from limiters of
// 8 to 12 r/s in steps of 0.5 (burst 5, Retry-After 2 s) at answers after
// 1, 2, 20 and 30 ms. The pace after the second cooldown is the tight
// reading of the ramp's refusal, read from the window since the bucket was
// last empty, and its lower bound is short of the rate by the room left in
// the bucket at the last admission, which depends on where on the grid of
// the ramp's levels the bucket fills: one rate alone is one phase (ADR 0029,
// the seventeenth look). It guards the spread across phases as it stands,
// not the aim: each cell within 1.18x (1.171x the worst, at 20 ms and
// 11.5 r/s) with at most 3 refusals, each latency's mean within 1.12x
// (1.104-1.118x), nothing early; at 2 ms, a pod's round trip on loopback,
// the mean within 1.11x with at most 21 refusals over the nine rates (the
// sixteenth look's bar for the spend). The aim of 1.1x in every cell is not
// met (16 of the 36 cells are over it); without the spend after the cold
// blast's probe (blastSpendLocked) the means are 1.128-1.134x.
func TestThePaceAfterTheRampAtEveryPhase(t *testing.T) {
	const files = 300
	for _, latency := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			var sum float64
			var n, refusals int
			for rate := 8.0; rate <= 12; rate += 0.5 {
				p := drainPacer(pacer.Limits{MaxInFlight: 2})
				r := drainBucket(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: rate, Burst: 5}}, files, 2*time.Second, latency)
				ratio := r.drain.Seconds() / (files / rate)
				t.Logf("PHASE %s %g r/s: ratio %.3f, %d rejections", latency, rate, ratio, r.rejections)
				r.checkHeld(t, 0)
				if ratio > 1.18 || r.rejections > 3 {
					t.Errorf("%g r/s: ratio %.3f, %d rejections (want at most 1.18 and 3)", rate, ratio, r.rejections)
				}
				sum += ratio
				refusals += r.rejections
				n++
			}
			mean := sum / float64(n)
			t.Logf("PHASE %s mean %.4f, %d rejections", latency, mean, refusals)
			if mean > 1.12 {
				t.Errorf("mean ratio %.4f (want at most 1.12)", mean)
			}
			// At a pod's round trip on loopback the spend's own bar
			// (the sixteenth look): without it 1.1283 and 21.
			if latency == 2*time.Millisecond && (mean > 1.11 || refusals > 21) {
				t.Errorf("mean ratio %.4f, %d rejections (want at most 1.11 and 21)", mean, refusals)
			}
		})
	}
}

// TestALimitersColdBlastStepsShort drains 300 files at floor 0 from
// nginx's default refusal (503 without Retry-After, burst 5) at 0.5 to 20
// r/s. The cold blast's refusal starts no cooldown, and its step is the
// first step over the blast's depth (333 ms for 6), not the contract's 2 s
// that left a 10 r/s origin idle and the ramp halving down from it (1.107x,
// 20 r/s 1.258x). At 0.5, 1 and 2 r/s the request after that step finds
// the bucket still full and is refused: the limiter's, not a failure
// (checkHeld), and the 2 s step follows (ADR 0030, "The request after the
// cold blast's short step").
func TestALimitersColdBlastStepsShort(t *testing.T) {
	const (
		files = 300
		burst = 5
	)
	for _, rate := range []float64{0.5, 1, 2, 5, 10, 20} {
		t.Run(fmt.Sprintf("%gr/s", rate), func(t *testing.T) {
			p := drainPacer(pacer.Limits{MaxInFlight: 2})
			r := drainBucket(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: rate, Burst: burst}}, files, 0, 20*time.Millisecond)
			ratio := r.drain.Seconds() * rate / files
			if len(r.refusedAt) == 0 {
				t.Fatal("nothing refused")
			}
			next := time.Duration(-1)
			for _, s := range r.starts {
				if s > r.refusedAt[0] {
					next = s - r.refusedAt[0]
					break
				}
			}
			t.Logf("ratio %.3f, %d rejections of %d, refused at %v, the next request %v after the blast's refusal",
				ratio, r.rejections, r.requests, r.refusedAt, next)
			if next < 0 || next > pacer.FirstStep/2 {
				t.Errorf("the first request after the blast's refusal left %v after it (want at most %v: the first step over the depth)", next, pacer.FirstStep/2)
			}
			r.checkHeld(t, 0)
			if ratio > 1.05 || r.rejections > files/50 {
				t.Errorf("drain ratio %.3f, %d rejections (want at most 1.05 and %d)", ratio, r.rejections, files/50)
			}
		})
	}
}
