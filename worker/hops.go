package worker

import (
	"context"
	"errors"
	"net"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// errHandOff is the gate's answer for a hop to an authority of a
// partition this pod does not serve (hopSet.gate, scheduler.hopBegin).
var errHandOff = errors.New("the authority's partition is served by another pod")

// hopSet admits the hops of one fetch: the first with the permit the
// scheduler acquired, each redirect hop with a permit of its own authority.
// It makes sure every permit gets exactly one Done. Safe for concurrent use.
type hopSet struct {
	d     *hopDeps
	first pacer.Permit
	kind  string
	part  int // the job's partition
	// url is the job's URL, given to the pacer with every hop's answer so
	// that one URL failing is not read as its origin failing.
	url string

	mu        sync.Mutex
	firstUsed bool
	hops      []*hopPermit
	conn      net.Conn // the connection of the latest request (httptrace's GotConn)
}

// hopDeps are what the hops of every fetch are admitted and reported
// with; the worker keeps one.
type hopDeps struct {
	pacer      Pacer
	clk        clock.Clock
	m          *Metrics
	sched      *scheduler
	auth       *authGuard // learns from every answer whether a credential works
	partitions int        // Options.Partitions
	holdMax    time.Duration
	wake       func() // a permit ended: the dispatcher may grant again
}

type hopPermit struct {
	pm pacer.Permit
	// part is the hop authority's partition when hopBegin counted the hop
	// there (-1: not counted).
	part    int
	once    sync.Once
	status  int
	verdict pacer.Verdict
	// disarm cancels the report of its write after the flush
	// (fetch.AfterNextWrite) once the hop is done; guarded by hopSet.mu.
	disarm func()
}

// gate is the fetch.Gate of the job.
func (h *hopSet) gate(ctx context.Context, _ int, a authority.Authority) (func(fetch.Result), error) {
	auth := a.String()
	h.mu.Lock()
	useFirst := !h.firstUsed && auth == h.first.Authority
	if useFirst {
		h.firstUsed = true
	}
	h.mu.Unlock()
	pm, part := h.first, -1
	if !useFirst {
		if hp := h.d.sched.partitionOf(auth); h.d.partitions > 0 && hp != h.part {
			// Another partition's authority: followed only if this pod
			// serves it, and counted there while it runs.
			if !h.d.sched.hopBegin(h.d.clk.Now(), hp, auth) {
				return nil, errHandOff
			}
			part = hp
		}
		var err error
		if pm, err = h.d.acquire(ctx, auth); err != nil {
			if part >= 0 {
				h.d.sched.hopEnd(part)
			}
			return nil, err
		}
	}
	p := &hopPermit{pm: pm, part: part}
	h.mu.Lock()
	h.hops = append(h.hops, p)
	h.mu.Unlock()
	return func(r fetch.Result) { h.done(p, r) }, nil
}

// trace reports every request the fetch writes to the pacer (Pacer.Sent):
// put in the context of the fetch, it is the net/http trace of each hop's
// request. A fetch's hops run one after the other, each admitted by gate
// before its request starts, so a write belongs to the latest hop
// admitted. WroteRequest fires once the request is written into net/http's
// buffer, also when the write failed: bytes may have left. For an HTTP/1.1
// GET that is just before the buffer is flushed to the socket, so the write
// is reported twice: at once, which ends the pacer's wait for it, and again
// when the flush has returned (fetch.AfterNextWrite), which moves it to when
// the bytes were with the kernel. A goroutine descheduled between the two
// would otherwise let the origin receive the request later than the pacer
// spaced the next one from (issue 35). It does not fire for a proxy's
// CONNECT, which the origin never sees. A request net/http retries on a new
// connection fires it again, which moves the write later.
func (h *hopSet) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			h.mu.Lock()
			h.conn = info.Conn
			h.mu.Unlock()
		},
		WroteRequest: func(httptrace.WroteRequestInfo) {
			h.mu.Lock()
			var hp *hopPermit
			if n := len(h.hops); n > 0 {
				hp = h.hops[n-1]
			}
			conn := h.conn
			h.mu.Unlock()
			if hp == nil || hp.pm.Authority == "" {
				return
			}
			pm := hp.pm
			h.d.pacer.Sent(h.d.clk.Now(), pm)
			if conn == nil {
				return
			}
			disarm := fetch.AfterNextWrite(conn, func() { h.d.pacer.Sent(h.d.clk.Now(), pm) })
			h.mu.Lock()
			if hp.disarm != nil {
				hp.disarm()
			}
			hp.disarm = disarm
			h.mu.Unlock()
		},
		// The answer has begun, so the request was flushed: an armed report
		// still waiting is HTTP/2's (its WroteRequest follows the flush),
		// and the connection's next write would be a window update or
		// another stream's request.
		GotFirstResponseByte: func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if n := len(h.hops); n > 0 && h.hops[n-1].disarm != nil {
				h.hops[n-1].disarm()
				h.hops[n-1].disarm = nil
			}
		},
	}
}

func (h *hopSet) done(p *hopPermit, r fetch.Result) {
	p.once.Do(func() {
		d := h.d
		now := d.clk.Now()
		v := d.pacer.Done(now, p.pm, pacer.Response{Status: r.Status, Header: r.Header, Err: r.Err, Cancelled: r.Cancelled, URL: h.url})
		h.mu.Lock()
		p.status, p.verdict = r.Status, v
		if p.disarm != nil {
			p.disarm()
			p.disarm = nil
		}
		h.mu.Unlock()
		if r.Status != 0 || (r.Err != nil && !r.Cancelled) {
			host, port := authority.Split(p.pm.Authority)
			d.m.CountUpstreamRequest(host, port, h.kind, upstreamOutcome(r, v))
		}
		d.auth.answered(p.pm.Authority, r.Status) // authfail.go
		d.sched.released(now, p.pm.Authority)
		if p.part >= 0 {
			d.sched.hopEnd(p.part)
		}
		d.wake()
	})
}

// close gives every permit that was never reported (a fetch that failed
// before a hop's request, or the first permit never used) its Done.
func (h *hopSet) close() {
	h.mu.Lock()
	hops := append([]*hopPermit(nil), h.hops...)
	firstUnused := !h.firstUsed
	h.firstUsed = true
	h.mu.Unlock()
	for _, p := range hops {
		h.done(p, fetch.Result{Cancelled: true})
	}
	if firstUnused {
		h.done(&hopPermit{pm: h.first, part: -1}, fetch.Result{Cancelled: true})
	}
}

// heard tells the pacer that the last hop's answer began with status, a
// 2xx whose body streams now (pacer.Pacer.Heard: a request the cold hold
// keeps waiting for it may start, not only once the body is in), and
// wakes the authority's queue as a release does when that ended a wait.
func (h *hopSet) heard(status int) {
	h.mu.Lock()
	var pm pacer.Permit
	if n := len(h.hops); n > 0 {
		pm = h.hops[n-1].pm
	}
	h.mu.Unlock()
	if pm.Authority == "" {
		return
	}
	now := h.d.clk.Now()
	if h.d.pacer.Heard(now, pm, status) {
		h.d.sched.released(now, pm.Authority)
		h.d.wake()
	}
}

// lastVerdict is the pacer's reading of the last reported hop.
func (h *hopSet) lastVerdict() pacer.Verdict {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.hops) == 0 {
		return pacer.Verdict{}
	}
	return h.hops[len(h.hops)-1].verdict
}

func (h *hopSet) lastStatus() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.hops) - 1; i >= 0; i-- {
		if h.hops[i].status != 0 {
			return h.hops[i].status
		}
	}
	return 0
}

// acquire admits a redirect hop. It waits in the fetch slot for up to
// HoldMax in all, in pacer.AcquireWait, the pacer's one loop from the ask to
// the start: the pacer reserves a start no further ahead than the time
// left, and a refusal is waited out only while decideHold, asked with the
// time left as the hop's HoldMax, holds the job; otherwise the refusal is
// returned and the job is deferred (worker.go). An in-flight refusal is a
// wait like any other here, not a release: no completion of another job
// wakes a fetch slot.
func (d *hopDeps) acquire(ctx context.Context, auth string) (pacer.Permit, error) {
	return pacer.AcquireWait(ctx, d.clk, d.pacer, auth, d.holdMax, func(re *pacer.RefusedError, left time.Duration) bool {
		h, _ := decideHold(holdFacts{wait: re.Wait, reason: reasonOf(re.Reason), holdMax: left})
		return h != holdDefer
	})
}
