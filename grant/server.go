package grant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// Pacer is what a Server needs of a pacer; *pacer.Pacer is one.
type Pacer interface {
	Acquire(now time.Time, auth string, maxWait time.Duration) (pacer.Permit, error)
	Confirm(now time.Time, pm pacer.Permit) (pacer.Permit, error)
	Sent(now time.Time, pm pacer.Permit)
	Done(now time.Time, pm pacer.Permit, r pacer.Response) pacer.Verdict
}

var _ Pacer = (*pacer.Pacer)(nil)

// Options configure a Server. A nil *Options and every zero field mean the
// defaults.
type Options struct {
	// Owns says whether this server answers for auth; nil: every
	// authority. A server stays silent on the others.
	Owns func(auth string) bool
	// Defer, if set, says how long an ask for auth must wait for the
	// owner's own work to go first (0: not at all); it is answered as a
	// wait with ReasonLiveFirst.
	Defer func(auth string) time.Duration
	// Lapse is DefaultLapse, MaxHold DefaultMaxHold.
	Lapse, MaxHold time.Duration
	// ID prefixes the grant ids (a pod's id); default "grant".
	ID     string
	Clock  clock.Clock
	Logger zerolog.Logger
}

// Server answers asks and reports for the authorities it owns from its
// pacer: a grant is a pacer.Permit confirmed at the answer, so it holds the
// floor, the in-flight cap, the cooldown and the probe like the pod's own
// requests; a report is its Done. A grant not reported within Lapse is
// done as cancelled. Safe for concurrent use.
type Server struct {
	nc  *nats.Conn
	p   Pacer
	o   Options
	clk clock.Clock

	// confirms are the asks waiting for a slot to come (confirm, each on
	// its own goroutine): Run waits for them before it lets the grants
	// still out lapse, so that none is made after.
	confirms sync.WaitGroup

	mu      sync.Mutex
	seq     uint64
	grants  map[string]*held // by grant id
	stopped bool             // Run is ending: no confirm starts, no grant is made
}

type held struct {
	pm     pacer.Permit
	lapses time.Time
}

// NewServer returns a Server answering on nc from p.
func NewServer(nc *nats.Conn, p Pacer, o *Options) *Server {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Lapse <= 0 {
		r.Lapse = DefaultLapse
	}
	if r.MaxHold <= 0 {
		r.MaxHold = DefaultMaxHold
	}
	if r.ID == "" {
		r.ID = "grant"
	}
	if r.Clock == nil {
		r.Clock = clock.Real{}
	}
	return &Server{nc: nc, p: p, o: r, clk: r.Clock, grants: map[string]*held{}}
}

// Run serves until ctx is done, then lets the grants still out lapse as
// cancelled.
func (s *Server) Run(ctx context.Context) error {
	asks, err := s.nc.Subscribe(AskPrefix+"*", func(m *nats.Msg) { s.ask(ctx, m) })
	if err != nil {
		return fmt.Errorf("grant: subscribe: %w", err)
	}
	defer asks.Unsubscribe()
	reports, err := s.nc.Subscribe(ReportPrefix+"*", s.report)
	if err != nil {
		return fmt.Errorf("grant: subscribe: %w", err)
	}
	defer reports.Unsubscribe()
	sent, err := s.nc.Subscribe(SentPrefix+"*", s.sent)
	if err != nil {
		return fmt.Errorf("grant: subscribe: %w", err)
	}
	defer sent.Unsubscribe()
	if err := s.nc.Flush(); err != nil {
		return fmt.Errorf("grant: subscribe: %w", err)
	}
	t := s.clk.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.stopped = true
			s.mu.Unlock()
			s.confirms.Wait() // each ends with ctx
			s.lapse(time.Time{})
			return nil
		case <-t.C():
			s.lapse(s.clk.Now())
			t.Reset(time.Second)
		}
	}
}

// ask answers one Ask: a grant once its slot has come (held up to
// MaxHold), or a wait. An ask for an authority this server does not own is
// left to its owner.
func (s *Server) ask(ctx context.Context, m *nats.Msg) {
	var a Ask
	if json.Unmarshal(m.Data, &a) != nil || a.Authority == "" || m.Subject != AskSubject(a.Authority) {
		s.reply(m, Answer{Wait: time.Second, Reason: "invalid"})
		return
	}
	if s.o.Owns != nil && !s.o.Owns(a.Authority) {
		return
	}
	if s.o.Defer != nil {
		if d := s.o.Defer(a.Authority); d > 0 {
			s.reply(m, Answer{Wait: d, Reason: ReasonLiveFirst})
			return
		}
	}
	pm, err := s.p.Acquire(s.clk.Now(), a.Authority, s.o.MaxHold)
	if err != nil {
		s.reply(m, refusal(err))
		return
	}
	if !pm.Start.After(s.clk.Now()) {
		s.confirm(ctx, m, pm, a.Writes)
		return
	}
	// The slot is to come: hold this ask, not the others.
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		s.p.Done(s.clk.Now(), pm, pacer.Response{Cancelled: true})
		s.reply(m, Answer{Wait: MovedWait, Reason: ReasonMoved})
		return
	}
	s.confirms.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.confirms.Done()
		s.confirm(ctx, m, pm, a.Writes)
	}()
}

// confirm waits for pm's start, confirms it and answers with the grant; a
// revoked permit (a cooldown learned meanwhile) is answered as a wait.
func (s *Server) confirm(ctx context.Context, m *nats.Msg, pm pacer.Permit, writes bool) {
	for {
		now := s.clk.Now()
		if d := pm.Start.Sub(now); d > 0 {
			if !clock.Sleep(s.clk, d, ctx.Done()) {
				s.p.Done(s.clk.Now(), pm, pacer.Response{Cancelled: true})
				return
			}
			continue
		}
		next, err := s.p.Confirm(now, pm)
		if err != nil {
			s.p.Done(now, pm, pacer.Response{Cancelled: true})
			s.reply(m, refusal(err))
			return
		}
		if next.Start.After(now) {
			pm = next
			continue
		}
		// The request starts with the answer: later starts are spaced from
		// now (the client sends it as soon as the answer arrives). Ownership
		// is checked again under mu, which Revoke holds: a grant is either
		// made while the authority is owned, or not at all.
		s.mu.Lock()
		if s.stopped {
			// Run has let the grants out lapse: one made now never would.
			// The pod is stopping; its authorities move to another.
			s.mu.Unlock()
			s.p.Done(now, next, pacer.Response{Cancelled: true})
			s.reply(m, Answer{Wait: MovedWait, Reason: ReasonMoved})
			return
		}
		if s.o.Owns != nil && !s.o.Owns(pm.Authority) {
			s.mu.Unlock()
			s.p.Done(now, next, pacer.Response{Cancelled: true})
			s.reply(m, Answer{Wait: MovedWait, Reason: ReasonMoved})
			return
		}
		if !writes {
			// The asker does not report its write: the answer counts as
			// it. One that does is awaited (its Sent, or the grant's end):
			// an asker slow to write after the answer (a loaded machine)
			// would otherwise bring its request and the next one closer
			// than the floor at the origin.
			s.p.Sent(now, next)
		}
		s.seq++
		id := s.o.ID + "-" + strconv.FormatUint(s.seq, 10)
		lapses := now.Add(s.o.Lapse)
		s.grants[id] = &held{pm: next, lapses: lapses}
		s.mu.Unlock()
		s.reply(m, Answer{Grant: id, Start: now, Lapses: lapses, Probe: next.Probe})
		return
	}
}

// report takes a Report: the grant's Done, answered with the verdict.
func (s *Server) report(m *nats.Msg) {
	var r Report
	if json.Unmarshal(m.Data, &r) != nil {
		return
	}
	s.mu.Lock()
	h := s.grants[r.Grant]
	delete(s.grants, r.Grant)
	s.mu.Unlock()
	if h == nil {
		if m.Reply != "" && (s.o.Owns == nil || s.o.Owns(r.Authority)) {
			s.reply(m, Verdict{Unknown: true})
		}
		return
	}
	resp := pacer.Response{Status: r.Status, Header: r.Header, Cancelled: r.Cancelled}
	if r.Error != "" {
		resp.Err = errors.New(r.Error)
	}
	v := s.p.Done(s.clk.Now(), h.pm, resp)
	s.reply(m, Verdict{Throttled: v.Throttled, Reason: v.Reason, Until: v.Until})
}

// sent takes a Sent: the grant's request was written, at the latest now;
// the pacer spaces the next start from now (pacer.Sent moves a write
// later), as it does for the pod's own requests.
func (s *Server) sent(m *nats.Msg) {
	var r Sent
	if json.Unmarshal(m.Data, &r) != nil {
		return
	}
	s.mu.Lock()
	h := s.grants[r.Grant]
	s.mu.Unlock()
	if h != nil {
		s.p.Sent(s.clk.Now(), h.pm)
	}
}

// lapse does the grants not reported by now as cancelled (every one, for
// a zero now).
func (s *Server) lapse(now time.Time) {
	s.mu.Lock()
	var due []pacer.Permit
	for id, h := range s.grants {
		if now.IsZero() || !now.Before(h.lapses) {
			due = append(due, h.pm)
			delete(s.grants, id)
		}
	}
	s.mu.Unlock()
	for _, pm := range due {
		s.p.Done(s.clk.Now(), pm, pacer.Response{Cancelled: true})
		s.o.Logger.Debug().Str("authority", pm.Authority).Msg("grant: a grant lapsed unreported")
	}
}

// Revoke ends every grant out for an authority that match accepts, as
// cancelled (its start, made, still counts in the pacer), and returns how
// many. A pod calls it when it gives up a partition, once Options.Owns
// refuses the partition's authorities: a later report of a revoked grant is
// answered Unknown, and the client asks again, of the new owner.
func (s *Server) Revoke(match func(auth string) bool) int {
	s.mu.Lock()
	var due []pacer.Permit
	for id, h := range s.grants {
		if match(h.pm.Authority) {
			due = append(due, h.pm)
			delete(s.grants, id)
		}
	}
	s.mu.Unlock()
	for _, pm := range due {
		s.p.Done(s.clk.Now(), pm, pacer.Response{Cancelled: true})
	}
	return len(due)
}

// Outstanding returns how many grants are out, not yet reported or lapsed.
func (s *Server) Outstanding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.grants)
}

func (s *Server) reply(m *nats.Msg, v any) {
	if m.Reply == "" {
		return
	}
	b, _ := json.Marshal(v)
	if err := m.Respond(b); err != nil {
		s.o.Logger.Debug().Err(err).Msg("grant: answer")
	}
}

// refusal turns the pacer's refusal into a wait.
func refusal(err error) Answer {
	var re *pacer.RefusedError
	if errors.As(err, &re) {
		return Answer{Wait: max(re.Wait, time.Millisecond), Reason: string(re.Reason), Until: re.Until}
	}
	return Answer{Wait: time.Second, Reason: "error"}
}
