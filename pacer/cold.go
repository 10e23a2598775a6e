package pacer

import "time"

// The cold hold (ADR 0029, the fifteenth look). Before an authority has
// refused anything, nothing is known of its limiter, and at floor 0 a pod
// sent its first requests two at a time (the in-flight cap): a blast that
// a limiter with a burst admits burst + 1 times and then refuses. The
// request started beside the refused one, before its answer came back,
// reached the origin after the refusal (and its Retry-After) had been
// written: in every pods run of the floor-0 cells, one request "while told
// to wait", granted 0.3 to 10 ms before the pod's pacer read the refusal.
// Once throttled, the crossing rule (reading.crossing) holds a request
// while the latest one is unanswered; the cold hold is the same rule for
// the cold blast, where no refusal has been timed: the round trip is that
// of the answers so far, and with none yet, Options.ColdHold. It lasts
// ColdAnswers answers, so an origin that never refuses pays it once.

// The open request is held behind by one of two rules: the crossing rule
// once the authority has refused something (its reading exists), the cold
// hold before. The next three functions pick the rule; the entry's lock
// must be held for each.

// openUntilLocked is until when a request other than permit seq may not
// start at n to e's authority; 0 when nothing holds it.
func (p *Pacer) openUntilLocked(e *entry, seq uint64, n int64) int64 {
	if e.rd != nil {
		return e.rd.crossing(seq, n)
	}
	return p.coldLocked(e, seq, n)
}

// openedLocked records the actual start of permit seq at n.
func (p *Pacer) openedLocked(e *entry, seq uint64, n int64) {
	e.ans.opened(seq, n) // the request after a quiet step (backoff.go)
	if e.rd != nil {
		e.rd.started(seq, n)
		return
	}
	p.coldStartedLocked(e, seq, n)
}

// closedLocked records the answer (or end) of pm's request at n; refused
// says whether a throttled answer's round trip is timed for the crossing
// rule (the cold hold times its own, learn's answers).
func (p *Pacer) closedLocked(e *entry, pm Permit, n int64, learn, refused bool) {
	if e.rd != nil {
		e.rd.answered(pm.seq, startOr(pm, n), n, refused, p.probeWait)
		return
	}
	p.coldDoneLocked(e, pm, n, learn)
}

// coldOnLocked is whether the cold hold is in force for e: the pacer holds
// cold blasts, and e has neither refused anything nor answered
// ColdAnswers requests yet.
func (p *Pacer) coldOnLocked(e *entry) bool {
	return p.coldHold > 0 && e.rd == nil && e.answered < ColdAnswers
}

// coldLocked is until when a request other than permit seq may not start
// at n to e's authority under the cold hold; 0 when nothing holds it. The
// entry's lock must be held.
func (p *Pacer) coldLocked(e *entry, seq uint64, n int64) int64 {
	if !p.coldOnLocked(e) {
		return 0
	}
	return e.cold.until(seq, n, crossingRTTs, min(int64(MinColdHold), p.coldHold), p.coldHold)
}

// coldStartedLocked records the start of permit seq at n under the cold
// hold. The entry's lock must be held.
func (p *Pacer) coldStartedLocked(e *entry, seq uint64, n int64) {
	if p.coldHold <= 0 {
		return
	}
	e.cold.started(seq, n)
	switch {
	case e.coldFrom == 0:
		e.coldFrom = n
	case e.blastFrom == 0 && e.answered >= ColdAnswers:
		// The first start after the hold: a blast begins here.
		e.blastFrom, e.coldFrom = e.answered, n
	}
}

// coldDoneLocked closes pm's request in the cold hold at n, its answer (or
// its end: cancelled, failed), and times its round trip when it was
// answered and still the open one (an answer Heard already closed was
// timed at its headers, not at its body's end). The entry's lock must be
// held.
func (p *Pacer) coldDoneLocked(e *entry, pm Permit, n int64, learn bool) {
	if p.coldHold <= 0 {
		return
	}
	measure := learn && pm.seq != 0 && pm.seq == e.cold.open
	e.cold.heard(pm.seq, startOr(pm, n), n, measure, p.coldHold)
}

// Heard reports that the answer to pm's request began to arrive at now
// with status: its status line and headers are in, its body may still
// stream (the worker calls it when its fetch returns a 2xx, whose Done
// follows the body). A 2xx is an admission, not a refusal, so it frees the
// request the cold hold keeps waiting for it (Options.ColdHold) without
// waiting for a body of 40 MB, and the round trip to it is what the hold
// waits for the next time. Any other status, and an authority past its
// cold hold, change nothing: their Done follows at once. Heard reports
// whether it ended the hold's wait on pm (a request to the authority may
// start now that could not before: the caller wakes its queue). It
// publishes nothing; calling it is optional (Done frees the hold as well),
// but a request held in the meantime waits for the body.
func (p *Pacer) Heard(now time.Time, pm Permit, status int) bool {
	if pm.seq == 0 || status < 200 || status > 299 || p.coldHold <= 0 {
		return false // no lock taken for what cannot end a hold
	}
	n := now.UnixNano()
	key := pm.paceKey()
	s := p.shardFor(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e == nil || !p.coldOnLocked(e) {
		return false
	}
	ended := e.cold.open == pm.seq
	e.cold.heard(pm.seq, pm.Start.UnixNano(), n, true, p.coldHold)
	return ended
}
