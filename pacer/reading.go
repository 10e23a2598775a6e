package pacer

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
	// blastEnd is the start of the first refused request while the
	// blast is still being counted (0 after): an admission started
	// before it and answered after the refusal (two in flight, the
	// refusal's short answer overtaking a body) belongs to the blast.
	blastEnd int64
	// tight is whether the last reading's two bounds were within
	// tightReading of each other: the rate is known, the pace is the
	// lower bound, and the interval does not creep below it.
	tight bool
	// dropped is whether admissions since the last escalation fell out of
	// at: the window may then have lost the bucket's last empty instant,
	// and the upper bound, which needs it, is not read.
	dropped bool
}

// A reading whose lower bound is at least tightReading of its upper one
// knows the origin's rate to a few percent: the pace holds at its lower
// bound, since each rejection a creep provokes costs a whole Retry-After.
// A looser one's middle errs either way by up to half the spread: the
// creep from it is looseCreep times faster (ADR 0029).
const (
	tightReading = 0.9
	looseCreep   = 4
)

// admitted records an admission started at start.
func (rd *reading) admitted(start int64) {
	if start < rd.blastEnd && rd.burst < maxBlast {
		rd.burst++
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
}

// rate reads (and notes whether it is tight) the origin's rate, in requests per second, from a refusal
// of a request started at t and the admissions before it; 0 when they
// bound nothing. It is the middle of the two bounds, or the upper one
// alone (less a tenth) when the admissions bound nothing below it.
func (rd *reading) rate(t int64) float64 {
	b := float64(rd.burst)
	var up, lo float64
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
	rd.tight = false
	if rd.dropped {
		up = 0
	}
	switch {
	case up <= 0:
		return lo
	case lo <= 0 || lo >= up:
		return up * 0.9
	}
	rd.tight = lo >= tightReading*up
	if rd.tight {
		return lo
	}
	return (lo + up) / 2
}

// startOr is pm's start, or n for a permit not made by Acquire.
func startOr(pm Permit, n int64) int64 {
	if pm.seq == 0 {
		return n
	}
	return pm.Start.UnixNano()
}
