package grant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// ErrNoOwner is what Client.Ask returns (wrapped) when no server answered
// within the client's timeout: no pod serves the authority now (between
// owners, or none running).
var ErrNoOwner = errors.New("grant: no server answered for the authority")

// Client asks for starts and reports answers. The zero value is not
// usable; build one with NewClient. Safe for concurrent use.
type Client struct {
	nc      *nats.Conn
	name    string
	timeout time.Duration
	clk     clock.Clock
	writes  bool // its asks say it reports writes (ReportingWrites)
}

// ReportingWrites returns a copy of c whose asks tell the owner that the
// caller reports each granted request's write with Sent (Ask.Writes), as
// Paced does: the owner then spaces its next start from the write itself.
func (c *Client) ReportingWrites() *Client {
	cp := *c
	cp.writes = true
	return &cp
}

// DefaultTimeout is how long a Client waits for an answer (NewClient's
// default): longer than a server's DefaultMaxHold.
const DefaultTimeout = 5 * time.Second

// NewClient returns a Client on nc that names itself name; timeout 0 is
// DefaultTimeout, a nil clk the wall clock.
func NewClient(nc *nats.Conn, name string, timeout time.Duration, clk clock.Clock) *Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if clk == nil {
		clk = clock.Real{}
	}
	return &Client{nc: nc, name: name, timeout: timeout, clk: clk}
}

// Ask asks once for a start for auth ("host:port"): a grant, or a wait.
// An ask the owner holds for its slot is answered within its MaxHold even
// when ctx ends meanwhile: a grant made as the caller gave up would hold
// the authority's place in the owner's pacer until it lapses (30 s of an
// origin left idle), so it is reported cancelled at once and Ask returns
// ctx's error.
func (c *Client) Ask(ctx context.Context, auth string) (Answer, error) {
	b, _ := json.Marshal(Ask{Authority: auth, Client: c.name, Writes: c.writes})
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	m, err := c.nc.RequestWithContext(rctx, AskSubject(auth), b)
	if err != nil {
		if ctx.Err() != nil {
			return Answer{}, fmt.Errorf("grant: ask for %s: %w", auth, ctx.Err())
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) {
			return Answer{}, fmt.Errorf("%w: %s (%w)", ErrNoOwner, auth, err)
		}
		return Answer{}, fmt.Errorf("grant: ask for %s: %w", auth, err)
	}
	var a Answer
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return Answer{}, fmt.Errorf("grant: answer for %s: %w", auth, err)
	}
	if ctx.Err() != nil {
		if a.Granted() {
			_, _ = c.Report(context.WithoutCancel(ctx), auth, a, pacer.Response{Cancelled: true})
		}
		return Answer{}, fmt.Errorf("grant: ask for %s: %w", auth, ctx.Err())
	}
	return a, nil
}

// Wait asks for a start for auth until it is granted, waiting out every
// wait it is told (and 1 s, then asking again, while no server answers),
// or until ctx is done. onWait, if set, is told each wait before it is
// waited out. The caller starts its request when Wait returns and reports
// it with Report.
func (c *Client) Wait(ctx context.Context, auth string, onWait func(Answer)) (Answer, error) {
	for {
		a, err := c.Ask(ctx, auth)
		switch {
		case err == nil && a.Granted():
			return a, nil
		case errors.Is(err, ErrNoOwner):
			a = Answer{Wait: time.Second, Reason: "no_owner"}
		case err != nil:
			return Answer{}, err
		}
		if onWait != nil {
			onWait(a)
		}
		if !clock.Sleep(c.clk, a.Wait, ctx.Done()) {
			return Answer{}, ctx.Err()
		}
	}
}

// Report tells the server what became of the request of grant g: the
// origin's answer (its status and headers) or the error. A request that
// was never started is reported with Cancelled.
func (c *Client) Report(ctx context.Context, auth string, g Answer, r pacer.Response) (Verdict, error) {
	rep := Report{Grant: g.Grant, Authority: auth, Status: r.Status, Header: Headers(r.Header), Cancelled: r.Cancelled}
	if r.Err != nil {
		rep.Error = r.Err.Error()
	}
	b, _ := json.Marshal(rep)
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	m, err := c.nc.RequestWithContext(rctx, ReportSubject(auth), b)
	if err != nil {
		return Verdict{}, fmt.Errorf("grant: report for %s: %w", auth, err)
	}
	var v Verdict
	if err := json.Unmarshal(m.Data, &v); err != nil {
		return Verdict{}, fmt.Errorf("grant: verdict for %s: %w", auth, err)
	}
	return v, nil
}

// Sent tells the owner that the request of grant g was written (a one-way
// publish; see Sent): call it when the request's headers leave, as the
// worker's trace does (Paced.Sent).
func (c *Client) Sent(auth string, g Answer) error {
	b, _ := json.Marshal(Sent{Grant: g.Grant, Authority: auth})
	if err := c.nc.Publish(SentSubject(auth), b); err != nil {
		return fmt.Errorf("grant: sent for %s: %w", auth, err)
	}
	return nil
}
