package pacer

// This file holds how an announced budget is spent (docs/contract.md section 3,
// "Announced budget"; ADR 0006). An origin that says how many requests
// remain (RateLimit r, X-RateLimit-Remaining...) is taken at its word:
//
//   - never more requests out than remain: a reading says what was left
//     after the request that got it, so every permit granted after that
//     request and still out is spent from it; while they are as many as the
//     reading's remaining count, Acquire refuses (ReasonInFlight) and the
//     next response brings a fresh reading;
//   - pace at the announced rate: when a quota is down to its last request
//     (one left, allowing for the permits out), starts are spaced by the
//     quota's policy (Window/Limit, RateLimit-Policy q/w or a Limit with a
//     window) instead of running the quota to zero at the floor; with more
//     left, the floor and the escalated interval alone apply.
//
// Neither rule ever makes the pacer faster than the floor or the interval.
// A reading lapses at its reset (after which the quota says nothing about
// the present) and is replaced by the reading of any later-granted request,
// or by that of an earlier-granted one that leaves less. An origin that
// never sends a remaining count gets no budget at all, and behaviour is the
// contract's floor, escalation and decay alone.

// budget is an authority's announced budget. Guarded by its shard's mutex.
type budget struct {
	// out are the seqs of permits granted since the budget was made and not
	// yet given back, ascending (seqs grow with every grant of a shard).
	out []uint64
	// Permits granted before the budget was made (seq <= baseSeq) are not
	// in out; old counts those still out, all taken as sent after any
	// reading.
	baseSeq uint64
	old     int32
	// readSeq is the permit whose response gave the reading.
	readSeq uint64
	n       int
	q       [MaxQuotas]heldQuota
}

// heldQuota is one quota of the reading.
type heldQuota struct {
	left  int64 // remaining when the reading was made
	until int64 // when the reading lapses (its reset); 0: when replaced
	pace  int64 // the policy's spacing (capped at MaxPause); 0: unknown
}

// newBudget makes a budget for an entry with inFlight permits already out,
// granted up to seq.
func newBudget(seq uint64, inFlight int32) *budget {
	return &budget{baseSeq: seq, old: inFlight}
}

// granted records a permit granted now.
func (b *budget) granted(seq uint64) { b.out = append(b.out, seq) }

// release records that the permit seq was given back (Done).
func (b *budget) release(seq uint64) {
	if seq <= b.baseSeq {
		if b.old > 0 {
			b.old--
		}
		return
	}
	for i, s := range b.out {
		if s == seq {
			b.out = append(b.out[:i], b.out[i+1:]...)
			return
		}
	}
}

// sentAfter is how many permits out were granted after the permit read,
// not counting except (0: none).
func (b *budget) sentAfter(read, except uint64) int64 {
	k := int64(b.old)
	if except != 0 && except <= b.baseSeq && k > 0 {
		k--
	}
	for i := len(b.out) - 1; i >= 0 && b.out[i] > read; i-- {
		if b.out[i] != except {
			k++
		}
	}
	return k
}

// limits returns whether a start now is over the announced budget, and the
// spacing the announced policies ask for, with k permits out after the
// reading besides the one to start.
func (b *budget) limits(n, k int64) (over bool, pace int64) {
	for i := 0; i < b.n; i++ {
		q := &b.q[i]
		if q.until != 0 && n >= q.until {
			continue // lapsed: the quota has reset since
		}
		if k > 0 && k >= q.left {
			over = true
		}
		if q.left-k <= 1 {
			pace = max(pace, q.pace)
		}
	}
	return over, pace
}

// tightest is the least that is left of any live quota of the reading after
// k more requests, and whether there is one.
func (b *budget) tightest(n, k int64) (int64, bool) {
	var least int64
	found := false
	for i := 0; i < b.n; i++ {
		q := &b.q[i]
		if q.until != 0 && n >= q.until {
			continue
		}
		if !found || q.left-k < least {
			least, found = q.left-k, true
		}
	}
	return least, found
}

// read takes a response's announced quotas as the reading if it is newer
// than the one held (its permit was granted later), or leaves less. seq is
// the permit that got the response; maxPause caps a policy's pace.
func (b *budget) read(n int64, seq uint64, qs []Quota, maxPause int64) {
	var nb budget
	nb.readSeq = seq
	for _, q := range qs {
		h := heldQuota{left: q.Remaining, pace: min(int64(q.Interval()), maxPause)}
		if q.Reset > 0 {
			h.until = n + int64(q.Reset)
		}
		if nb.n < len(nb.q) {
			nb.q[nb.n] = h
			nb.n++
		}
	}
	if b.n > 0 && seq < b.readSeq {
		cur, ok := b.tightest(n, b.sentAfter(b.readSeq, 0))
		nw, _ := nb.tightest(n, b.sentAfter(seq, 0))
		if ok && nw >= cur {
			return // an older reading that says no less: keep the newer one
		}
	}
	b.readSeq, b.n, b.q = nb.readSeq, nb.n, nb.q
}

// idle reports whether the budget can be forgotten with its entry: nothing
// out and no reading that has yet to reset (one without a reset would never
// let an entry go).
func (b *budget) idle(n int64) bool {
	if len(b.out) > 0 || b.old > 0 {
		return false
	}
	for i := 0; i < b.n; i++ {
		if q := &b.q[i]; q.until != 0 && n < q.until {
			return false
		}
	}
	return true
}
