package pacer

import (
	"math"
	"time"
)

// The reading of an origin's rate after a throttling answer (ADR 0029).
//
// A limiter in front of an origin (nginx limit_req, HAProxy stick tables)
// is a leaky bucket: an admission adds one to an excess that leaks at the
// rate r, and a request whose admission would lift the excess above the
// burst b is refused. Counting the answers over the time between two
// escalations reads r too slow whenever the bucket sat empty in that time
// (the cooldown, the escalated interval's slow requests): capacity that
// was never asked for. The reading below counts only what the bucket
// itself implies. If the excess was 0 at admission a_i (the bucket empty:
// true at least once after a cooldown longer than b/r), the refusal at t
// after m admissions from a_i on means m + 1 - r(t - a_i) > b, so
//
//	r < max_i (m_i + 1 - b) / (t - a_i)                        (upper)
//
// and every admission a_j after a_i was admitted, so j - i + 1 - r(a_j - a_i)
// <= b:
//
//	r >= max_{i<j} (j - i + 1 - b) / (a_j - a_i)               (lower)
//
// Windows where the worker sent slower than the origin add nothing to
// either maximum, so idle capacity no longer biases the reading. The
// burst is read from the first blast: the admissions from a cold start
// that started before the first refused request. nginx admits burst + 1 in
// a row into an empty bucket (its excess is clamped at 0 after the request
// is added, limitreq), so that count, not one less, is the depth b of the
// bounds below.

// readingSize is how many of the latest admissions a reading keeps: the
// bound's window is where the worker sent faster than the origin, a few
// bursts long.
const readingSize = 64

// maxBlast is the most admissions before a first refusal still read as a
// blast into an empty bucket: more say the client was not sending faster
// than the origin from the start, and the burst stays unknown (0).
const maxBlast = readingSize

// reading is an entry's record of the admissions since its last
// escalation; nil until the first throttling answer, so an authority never
// throttled pays one pointer for it.
type reading struct {
	at [readingSize]int64 // start instants of the latest admissions, ascending
	n  int32              // how many of at hold admissions
	// burst is how many admissions an empty bucket takes in a row, as the
	// first blast read it: nginx's burst= plus one (limitreq), which is
	// the bucket's depth in the bounds below. 0: unknown.
	burst int32
	// blastEnd is when the first refusal came back, while the blast is
	// still being counted (0 after): an admission started at or before
	// it and answered after it belongs to the blast. It was in flight
	// beside the refused request, sent before anything was known, and
	// the origin took it before the refused one: granted at the same
	// instant, or later and overtaking it (a pod's refused request was
	// confirmed 4 ms after its grant, and the stub ran the handler of
	// the one granted 6 ms after it first), its body answered after the
	// refusal's short answer. Counted only when started before the
	// refused request, it was lost, and a pod read the depth one short
	// in 2 runs of 12 (ADR 0029, the tenth look).
	blastEnd int64
	// tight is whether the last reading's two bounds were within
	// tightReading of each other: the rate is known, the pace is near
	// the lower bound (tightPlace), and the interval does not creep
	// below it.
	tight bool
	// dropped is whether admissions since the last escalation fell out of
	// at: the window may then have lost the bucket's last empty instant,
	// and the upper bound, which needs it, is not read (but at a held
	// pace: rate).
	dropped bool
	// deeper is whether a refusal at a held pace has read the blast's
	// depth one deeper already (rate): once.
	deeper  bool
	capHeld int32
	// opening's rtt is how long a refusal takes to come back, from its
	// start to its answer (the longest lately). While its open request
	// is younger than crossingRTTs round trips, no other request starts:
	// one sent then would be on its way when a refusal of open left the
	// origin, and the origin counts it as early (ADR 0029, "Requests
	// that cross a refusal").
	opening
	// capIv is the interval a loose reading's creep stops at: the upper
	// bound's rate less upperMargin (0: no upper bound read), and
	// capHeld (beside dropped, where it costs no padding) how many
	// answers the interval has held there since.
	capIv int64
	// lo and up are the bounds of the readings so far (0: none), which
	// the next joins while they agree with it.
	lo, up float32
	// spend is how many answers more the interval gives way to the
	// floor while a bucket that a cooldown drained fills back
	// (spendFor, and half of it after the cold blast's cooldown:
	// Pacer.blastSpendLocked); 0 when it does not. spent is whether a
	// spend was started since the last escalation.
	spend int32
	spent bool
	// total counts the admissions started since the last escalation
	// (since), first the earliest of their starts: the bucket's empty
	// instant after a cooldown, which the upper bound of a refusal at a
	// held pace counts from when the window lost it (dropped).
	total int32
	first int64
	since int64
	// blastSpan is how long the first blast took under a pacer with the
	// cold hold (from its first start, or the first after the hold's end,
	// to the refused one's): the pace's first reading takes the bucket's
	// leak in it off the depth (unleak); 0 after, or without the hold.
	blastSpan int64
	// blastCool is the cooldown of the cold blast's refusal when its
	// step was the cooldown over the depth (escalateLocked), and
	// blastBase what else bounded that step from below (twice the
	// interval before, the floor); 0 otherwise, and blastCool 0 again
	// at the next escalation. An admission of the blast counted after
	// the refusal deepens the bucket, and the step with it
	// (blastGrewLocked); the probe's answer spends half the bucket that
	// step assumed drained (blastSpendLocked).
	blastCool, blastBase int64
	// blastQuiet: the blast's refusal was a limiter's 503 and started no
	// cooldown; blastCool is then the contract's first step, over which
	// the depth gave the step, and nothing drained the bucket, so nothing
	// is spent after it (blastSpendLocked).
	blastQuiet bool
	// margin is what a depth-1 pace holds above the lower bound's
	// spacing (0: limiterTick, the limiter's clock), widened by each
	// refusal at that pace (jitterLocked) and narrowed again after
	// calm answers at it without one (narrowLocked); narrowed is whether
	// the last change narrowed it, hold how many answers the next
	// narrowing waits for (0: marginCalm), doubled by each narrowing
	// refused before the next, and spiked whether a refusal widened it
	// since the reading was last loosened.
	margin   int64
	calm     int32
	hold     int32
	narrowed bool
	spiked   bool
}

// marginCalm is how many answers at a depth-1 pace, with no refusal, the
// margin holds before it halves back toward limiterTick (narrowLocked):
// the margin widened for a spell of late arrivals (a busy pod, a slow
// handler) would otherwise keep the pace up to maxJitterMargin slow for
// the authority's life. A narrowing the jitter still refuses costs a
// refusal (and a Retry-After), and doubles the wait for the next one, so
// that a steady jitter is asked about ever more rarely. 200 was measured
// against 50, 100 and 400 (ADR 0029, the thirteenth look, "The margin
// narrows"): fewer refusals than 50 or 100 under a steady jitter (0.20% of
// 5000 files, 0.13% never narrowing) for about 100 answers more to come
// back after a spell; 400 came back too late for a 1000-file drain.
const marginCalm = 200

// marginHoldMax is the most answers a narrowing waits for after refusals:
// with a steady jitter, at most one refusal per marginHoldMax answers.
const marginHoldMax = 32 * marginCalm

// maxJitterMargin is the most a depth-1 pace's margin may add to the
// spacing it covers, as a fraction of it: past it a refusal at the pace is
// read as the origin's rate dropping, not as the arrivals' jitter.
const maxJitterMargin = 0.2

// marginOr is the depth-1 pace's margin above the lower bound's spacing.
func (rd *reading) marginOr() int64 {
	if rd.margin <= 0 {
		return limiterTick
	}
	return rd.margin
}

// holdOr is how many answers at a depth-1 pace the next narrowing of its
// margin waits for.
func (rd *reading) holdOr() int32 {
	if rd.hold <= 0 {
		return marginCalm
	}
	return rd.hold
}

// reset starts the reading of a new window at the escalation at n.
func (rd *reading) reset(n int64) {
	rd.n, rd.dropped, rd.spend, rd.spent = 0, false, 0, false
	rd.total, rd.first, rd.since = 0, 0, n
}

// spendHeadroom is how much of the bucket's depth the spend after a
// cooldown leaves: one request in flight beside the last spent one, and
// one for a pace a little faster than the rate.
const spendHeadroom = 2

// spendFor starts the spend of the bucket at n, the probe's answer
// after the escalation at esc (or the first answer at the learned pace
// after it, where the bucket had not drained by the probe's), with
// answered admissions since; once per escalation. A pace at or under the
// rate never fills the bucket, so the burst that a cooldown gave back was
// never taken: at 10 r/s, six requests' worth of the origin's capacity,
// 0.6 s of every refusal's silence (ADR 0029, "The arithmetic limit"
// counts it taken back; the eighth look). Only a tight reading knows the
// depth and a rate to spend it against, and only when the lower bound's
// leak since the escalation empties a bucket as deep as the depth plus
// the admissions since (the probe, and the request after it where the
// spend starts there): at 2 r/s with a 1 s Retry-After it does not, and
// nothing is spent. The spend leaves spendHeadroom of the depth; the
// crossing rule still holds each spent request until the one before it
// is answered. It starts at the probe's answer since the thirteenth look:
// from the next answer, the request between left at the escalated
// interval into a bucket already empty.
func (rd *reading) spendFor(n, esc int64, answered int32) {
	if rd == nil || rd.spent || !rd.tight || rd.burst <= spendHeadroom || rd.lo <= 0 {
		return
	}
	if float64(n-esc)/1e9*float64(rd.lo) < float64(rd.burst+answered) {
		return
	}
	rd.spend, rd.spent = rd.burst-spendHeadroom, true
}

// crossingRTTs is how many refusal round trips an unanswered request
// holds the next one back: one is the round trip itself, the second a
// margin for the answer's jitter (a busy CPU, a GC pause).
const crossingRTTs = 2

// rampHalving is the least time between two halvings of the ramp, the
// interval coming down from an escalation while no pace is learned (after
// the first refusal). Halved per answer alone, at a round trip of a
// millisecond or two (a pod on loopback), it went from 62 ms to 2 ms in
// five requests: the bucket filled within one doubling of the rate, and
// the refusal bounded the rate only to a factor of two (8.1 to 16.2 r/s
// for 10), whose middle was fast and cost a third refusal. Held for
// rampHalving at each level below it, the ramp sends rampHalving times
// the rate of the first level faster than the origin (between r and 2r:
// 5 to 10 requests at 10 r/s) at a steady spacing, and the refusal reads
// the rate within about 10% (ADR 0029, "The ramp dwells"). Levels above
// it still halve per answer, so the ramp costs at most rampHalving per
// doubling more than before.
const rampHalving = int64(500 * time.Millisecond)

// opening is the latest request started to an authority and not yet
// answered, and the round trip its answer is expected within: what the
// crossing rule (reading.crossing, once throttled) and the cold hold
// (Pacer.coldLocked, before) hold the next request behind. The zero value
// holds nothing.
type opening struct {
	// open is the permit of the latest start (its confirm, moved to its
	// write) not yet answered, 0 if none, and openAt that start; rtt is
	// the round trip the rule measures (0: none yet).
	open   uint64
	openAt int64
	rtt    int64
}

// started records the actual start of permit seq at n (Acquire's grant
// for now, or Confirm).
func (o *opening) started(seq uint64, n int64) {
	if seq != 0 && n >= o.openAt {
		o.open, o.openAt = seq, n
	}
}

// wrote records the write of permit seq at n (Sent): the origin receives it
// then, so a refusal's way back counts from there. A write reported after
// the answer (Sent after Done) opens nothing.
func (o *opening) wrote(seq uint64, n int64) {
	if seq != 0 && seq == o.open {
		o.openAt = max(o.openAt, n)
	}
}

// heard closes permit seq, started at start, if it is the open one, at n,
// its answer's arrival; with measure, the answer's round trip (from its
// write when it is the open one) becomes rtt, capped at most, while an
// older one fades by an eighth per answer.
func (o *opening) heard(seq uint64, start, n int64, measure bool, most int64) {
	if seq != 0 && seq == o.open {
		start = max(start, o.openAt)
		o.open = 0
	}
	if measure && start != 0 && n > start {
		o.rtt = max(min(n-start, most), o.rtt-o.rtt/8)
	}
}

// until is until when a request other than seq may not start at n: the
// open request's start plus rtts round trips (at least least and at most
// most after it), while it is unanswered and younger than that; 0 when
// nothing holds it. With no round trip measured yet it holds for most.
func (o *opening) until(seq uint64, n, rtts, least, most int64) int64 {
	if o.open == 0 || o.open == seq {
		return 0
	}
	hold := most
	if o.rtt > 0 {
		hold = min(hold, max(rtts*o.rtt, least))
	}
	if until := o.openAt + hold; until > n {
		return until
	}
	return 0
}

// answered records the answer at n to permit seq, started at start (its
// grant's Start; its write when it is the open one), and for a refusal the
// round trip it took, capped at most (ProbeWait: a refusal slower than that
// is a slow origin, not a round trip). An older round trip fades by an
// eighth per refusal, so that one slow answer does not hold every later
// start back for the rest of the run.
func (rd *reading) answered(seq uint64, start, n int64, refused bool, most int64) {
	rd.heard(seq, start, n, refused, most)
}

// crossing is until when a request other than seq may not start at n: the
// open request's start plus crossingRTTs round trips, while it is
// unanswered and younger than that; 0 when nothing holds it, or no refusal
// has been timed yet.
func (rd *reading) crossing(seq uint64, n int64) int64 {
	if rd.rtt <= 0 {
		return 0
	}
	return rd.until(seq, n, crossingRTTs, 0, math.MaxInt64)
}

// A reading whose lower bound is at least tightReading of its upper one
// knows the origin's rate to a few percent: the pace holds tightPlace of
// the spread above its lower bound, with no creep, since each rejection a
// creep provokes costs a whole Retry-After. Held at the lower bound itself
// it paid the whole spread when the rate is near the upper one (a pod read
// 1.9 r/s for 2); a quarter above it pays at most three quarters of it,
// and where the rate is below that point, overshoots it by at most a
// quarter of 10%, which a bucket of depth b absorbs for b/(0.025 r) s
// (120 s at 2 r/s) before one refusal tightens the reading. A looser
// one's middle errs either way by up to half the spread: the creep from
// it is looseCreep times faster (ADR 0029). The middle was tried for a
// tight reading too (the eighth look): right in virtual time, where the
// 10 r/s ramp reads [9.60, 10.29] for 10, but the pods' readings, from
// starts that are not arrivals, put the rate lower in the spread, and
// their middle paced 99 ms for 100 and was refused twice more.
//
// The upper bound is a rate the origin refused: a creep past it is bound
// to be refused again, one Retry-After and a first step for a reading
// that a creep below it gets as well. So a loose reading's creep stops
// upperMargin below it, and holds there for Decay answers (the time a
// creep takes to halve the interval); then it creeps on, in case the
// bound was read too low (a blast slower than 1/r reads the depth one
// high and every bound slow, ADR 0029).
const (
	tightReading = 0.9
	tightPlace   = 0.25
	looseCreep   = 4
	upperMargin  = 1.02
)

// capFor is the interval the creep may not go below at iv after
// another answer, holding hold answers at the upper bound's cap: the
// floor's, or the cap while it holds. It counts the answer as held when
// iv is at the cap already.
func (rd *reading) capFor(iv, floor int64, hold int32) int64 {
	if rd == nil || rd.capIv <= floor || rd.capHeld >= hold {
		return floor
	}
	if iv <= rd.capIv {
		rd.capHeld++
	}
	return rd.capIv
}

// admitted records an admission started at start, and reports whether it
// was counted into the blast after its refusal.
func (rd *reading) admitted(start int64) (blast bool) {
	if start <= rd.blastEnd && rd.burst < maxBlast {
		rd.burst++
		blast = true
	}
	if start >= rd.since && rd.total < math.MaxInt32 {
		if rd.total == 0 || start < rd.first {
			rd.first = start
		}
		rd.total++
	}
	if rd.n == readingSize {
		copy(rd.at[:], rd.at[1:])
		rd.n--
		rd.dropped = true
	}
	i := rd.n
	for ; i > 0 && rd.at[i-1] > start; i-- {
		rd.at[i] = rd.at[i-1]
	}
	rd.at[i] = start
	rd.n++
	return blast
}

// rate reads (and notes whether it is tight) the origin's rate, in
// requests per second, from a refusal of a request started at t and the
// admissions before it; 0 when they bound nothing. It is the middle of the
// two bounds, a quarter of a tight reading's spread above its lower bound,
// or the upper one alone (less a tenth) when the admissions bound nothing
// below it.
//
// held is the interval the refused request was sent at when it is a
// refusal at a held pace (heldRefusalLocked), 0 otherwise. The origin
// refused a steady 1/held: under a rate of at least that, each request
// spaced by held from an admitted one leaves the bucket no fuller than the
// one before, and is admitted too. So the upper bound is at most 1/held;
// where the cooldown emptied the bucket, the window's upper bound counts
// from the first admission since the escalation also when the window lost
// it (the same pace came back every 8.5 s in a pod: its windows held more
// than 64 admissions, read no upper bound, and joined the bounds before
// unchanged), and the bounds of the readings before that contradict the
// window's (their lower bound above its upper one) were read with a depth
// one short: the window is read again, once, one deeper. The pace is then
// the lower bound, not a quarter above it: the quarter was a bet the origin
// has refused (ADR 0029, the tenth look).
func (rd *reading) rate(t, held int64) float64 {
	// Where the silence before the first admission since the
	// escalation did not leak a bucket of the depth read at the lower
	// bound known (a 1 s Retry-After at 5 r/s and a depth of 11), the
	// window's upper bound, which counts from an empty bucket, may be
	// too low: it is not read from the first admission, and its
	// contradicting the readings before says nothing of the depth.
	emptied := held > 0 && rd.total > 0 && rd.first > rd.since &&
		float64(rd.first-rd.since)/1e9*float64(rd.lo) >= float64(rd.burst)
	lo, up := rd.bounds(t, held, emptied)
	rd.tight, rd.capIv, rd.capHeld = false, 0, 0
	// The bounds of the readings before hold as long as the rate does:
	// the tightest of them join this window's, unless they contradict
	// it (the rate changed, or a depth was misread), when this window's
	// alone are read.
	if pl, pu := float64(rd.lo), float64(rd.up); pl > 0 || pu > 0 {
		cl, cu := max(lo, pl), up
		if pu > 0 && (cu <= 0 || pu < cu) {
			cu = pu
		}
		switch {
		case cu <= 0 || cl < cu:
			lo, up = cl, cu
		case emptied && !rd.deeper && rd.burst > 0 && rd.burst < maxBlast:
			rd.burst++
			rd.deeper = true
			lo, up = rd.bounds(t, held, emptied)
		}
	}
	rd.lo, rd.up = float32(lo), float32(up)
	if up > 0 {
		rd.capIv = int64(upperMargin * 1e9 / up)
	}
	switch {
	case up <= 0:
		return lo
	case lo <= 0 || lo >= up:
		return up * 0.9
	}
	rd.tight = lo >= tightReading*up
	switch {
	case rd.tight && held > 0:
		return lo
	case rd.tight:
		return lo + tightPlace*(up-lo)
	}
	return (lo + up) / 2
}

// bounds are the window's lower and upper bounds on the rate at the depth
// read (the comment at the top) for a refusal of a request started at t;
// 0 where they bound nothing. held is rate's, and emptied whether the
// bucket was empty at the first admission since the escalation.
func (rd *reading) bounds(t, held int64, emptied bool) (lo, up float64) {
	b := float64(rd.burst)
	for i := int32(0); i < rd.n; i++ {
		d := float64(t-rd.at[i]) / 1e9
		if d <= 0 {
			continue
		}
		if v := (float64(rd.n-i) + 1 - b) / d; v > up {
			up = v
		}
		for j := i + 1; j < rd.n; j++ {
			d := float64(rd.at[j]-rd.at[i]) / 1e9
			if d <= 0 {
				continue
			}
			if v := (float64(j-i+1) - b) / d; v > lo {
				lo = v
			}
		}
	}
	if rd.dropped {
		// The window may have lost the bucket's last empty instant: its
		// upper bound is none, but at a held pace (the probe into the
		// bucket the cooldown emptied, then the pace) that instant is
		// the first admission since the escalation, which rd.total
		// counts from.
		if d := float64(t-rd.first) / 1e9; emptied && d > 0 {
			up = max(up, (float64(rd.total)+1-b)/d)
		} else {
			up = 0
		}
	}
	if held > 0 {
		if ref := 1e9 / float64(held); up <= 0 || up > ref {
			up = ref
		}
	}
	return lo, up
}

// startOr is pm's start, or n for a permit not made by Acquire.
func startOr(pm Permit, n int64) int64 {
	if pm.seq == 0 {
		return n
	}
	return pm.Start.UnixNano()
}

// unleakRounds is how many times unleak reads the rate again from a
// shallower depth: each reading from a depth too deep is slow, so the
// depth it corrects to may still be a little deep.
const unleakRounds = 3

// unleak is rate at the pace's first reading after a blast the cold hold
// sent one request at a time (blastSpan > 0), over blastSpan from its first
// start to the refused one's: the bucket leaked r·blastSpan meanwhile, so
// of the burst admissions counted it held only burst − r·blastSpan, and a
// cold start's bucket of depth D admits burst in a row where D ∈
// [burst − r·blastSpan, burst + 1 − r·blastSpan): the ceiling of the lower
// end. At 20 ms a round trip and 10 r/s, a bucket of 6 admitted 7 (0.12 s
// leaked 1.2), and the pace read from a depth of 7 was 9% slow (ADR 0029,
// the fifteenth look). r is taken at the reading's upper bound (its lower
// one with none): read from a depth too deep the bounds are low, and at
// the lower one the depth stayed too deep at 30 ms (8 counted over 0.24 s,
// corrected to 7 for 6: a pace of 125 ms for 100, 1.304x); the upper bound
// gives 6 and 1.118x. A depth one short is what a refused pace corrects
// (the tenth look); one deep is paid for the rest of the run. The bound
// read from the corrected depth is higher, and the count, not the
// corrected depth, is corrected again with it, at most unleakRounds times,
// once per blast (a first version took the leak off the depth it had
// already corrected and went 7, 6, 5, 4).
func (rd *reading) unleak(t, held int64) float64 {
	span := rd.blastSpan
	rd.blastSpan = 0
	if span <= 0 {
		return rd.rate(t, held)
	}
	before := *rd
	counted := float64(before.burst)
	r := rd.rate(t, held)
	for range unleakRounds {
		if r <= 0 {
			break
		}
		at := float64(rd.lo)
		if rd.up > 0 {
			at = float64(rd.up)
		}
		d := int32(math.Ceil(counted - at*float64(span)/1e9 - 1e-9))
		if d < 1 || d >= before.burst {
			break
		}
		// Read again from the bounds before this reading, at depth d.
		before.burst = d
		*rd = before
		r = rd.rate(t, held)
	}
	return r
}
