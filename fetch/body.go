package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// The causes with which a body's request context is cancelled by its rate
// timers; mapErrLocked turns them into ErrTooSlow with the figures.
var (
	errRateCut     = errors.New("below the minimum rate")
	errDeadlineCut = errors.New("past the total deadline")
)

// body wraps a response body: it enforces the size limit and the idle
// timeout, turns a short body into ErrTruncated, and reports the hop to the
// gate's done func when closed. Read is not safe for concurrent use (as any
// reader); Close may be called concurrently with Read.
type body struct {
	rc     io.ReadCloser
	max    int64 // bytes allowed
	want   int64 // Content-Length, or -1
	idle   time.Duration
	ctx    context.Context // the caller's
	hctx   context.Context // this hop's request, cancelled by the watch and the deadline
	cancel context.CancelCauseFunc
	done   func(Result)
	// watch is armed during each Read of rc, for whichever ends first:
	// the idle timeout, or the minimum rate's window without its bytes.
	// It cancels hctx with the cause Read chose (cut): one timer for both,
	// so one Reset and one Stop a read (ADR 0036, ninth pass).
	watch *time.Timer
	now   func() time.Time

	// The minimum rate: need bytes per window of time spent in reads. The
	// watch cancels hctx with errRateCut when a read would carry the window
	// past its end without the bytes; minRate 0: no minimum. wBytes and
	// wTime are the current window's, touched by Read only.
	minRate     int64
	window      time.Duration
	need        int64
	wBytes      int64
	wTime       time.Duration
	deadline    *time.Timer   // cancels hctx with errDeadlineCut; nil: none
	deadlineIn  time.Duration // the total deadline, for its error message
	deadlineAt  time.Time     // when deadline fires; moved later by the time waited on the throttle
	sizeLimited bool          // max is the job's expected size, not MaxBodySize

	// The bandwidth caps: credit is the bytes the throttle granted and the
	// body has not read yet; a read asks for more only when it is spent.
	// nil throttle: no cap. Touched by Read only (Close closes throttle).
	throttle BodyThrottle
	credit   int64

	mu      sync.Mutex
	reading bool  // a read of rc is blocked; only then may the watch cut
	cut     error // the watch's cause for this read: ErrIdleTimeout or errRateCut
	n       int64
	err     error  // sticky read error
	res     Result // reported on Close; res.Err is a transport failure only
	eof     bool
	closed  bool
}

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	err, n0 := b.err, b.n
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	// One byte past the limit is asked for so an oversized body shows.
	if rem := b.max - n0 + 1; int64(len(p)) > rem {
		p = p[:rem]
	}
	if b.throttle != nil {
		if b.credit == 0 {
			if err := b.waitThrottle(len(p), n0); err != nil {
				return 0, err
			}
		}
		if int64(len(p)) > b.credit {
			p = p[:b.credit]
		}
	}
	in, cut := b.idle, ErrIdleTimeout
	if b.minRate > 0 && b.wBytes < b.need {
		if left := max(b.window-b.wTime, 0); left < in {
			in, cut = left, errRateCut
		}
	}
	b.mu.Lock()
	b.reading, b.cut = true, cut // before the watch is armed: it may fire at once
	b.mu.Unlock()
	b.watch.Reset(in)
	t0 := b.now()
	n, err := b.rc.Read(p)
	took := b.now().Sub(t0)
	b.mu.Lock()
	b.reading = false // from here the window is judged below, not by the watch
	b.mu.Unlock()
	b.watch.Stop()
	if b.minRate > 0 {
		b.wBytes += int64(n)
		b.wTime += took
		if b.wTime >= b.window {
			if b.wBytes < b.need && err == nil {
				b.cancel(errRateCut)
				err = errRateCut
			}
			b.wBytes, b.wTime = 0, 0
		}
	}

	b.credit = max(b.credit-int64(n), 0)

	b.mu.Lock()
	defer b.mu.Unlock()
	b.n += int64(n)
	switch {
	case b.n > b.max && b.sizeLimited:
		n -= int(b.n - b.max)
		b.n = b.max
		err = fmt.Errorf("more than the expected %d bytes: %w", b.max, ErrSizeMismatch)
	case b.n > b.max:
		n -= int(b.n - b.max)
		b.n = b.max
		err = fmt.Errorf("more than %d bytes: %w", b.max, ErrBodyTooLarge)
	case err == nil:
	case err == io.EOF:
		if b.want >= 0 && b.n < b.want {
			err = fmt.Errorf("got %d of %d bytes: %w", b.n, b.want, ErrTruncated)
			b.res.Err = err
		} else {
			b.eof = true
		}
	default:
		err = b.mapErrLocked(err)
		b.res.Err = err
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

// waitThrottle waits for the bandwidth caps to grant up to n bytes (no
// more than the rest of a body of known length, and one byte to see its
// end) and adds them to b.credit. The watch is not armed
// meanwhile, and the total deadline is stopped and moved later by the time
// waited: a capped body is slow by the operator's choice, not the
// origin's. n0 is the bytes read so far.
func (b *body) waitThrottle(n int, n0 int64) error {
	if b.want >= 0 {
		n = int(min(int64(n), max(b.want-n0, 0)+1))
	}
	t0 := b.now()
	var left time.Duration
	stopped := b.deadline != nil && b.deadline.Stop()
	if stopped {
		left = b.deadlineAt.Sub(t0)
	}
	g, err := b.throttle.Wait(b.hctx, n)
	b.mu.Lock()
	defer b.mu.Unlock()
	if stopped && !b.closed {
		b.deadlineAt = b.now().Add(left)
		b.deadline.Reset(max(left, 0))
	}
	if err != nil {
		err = b.mapErrLocked(err)
		b.err, b.res.Err = err, err
		return err
	}
	b.credit = int64(max(g, 1))
	return nil
}

// watchCut is the watch's function: a read still blocked has waited past
// the idle timeout, or its window ended without the bytes it lacked. A
// read that returned in the meantime is not cut: data came within the
// idle timeout, and it judges its window itself (bytes may have arrived at
// the last moment).
func (b *body) watchCut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reading {
		b.cancel(b.cut)
	}
}

// mapErrLocked names a transport read error. b.mu is held.
func (b *body) mapErrLocked(err error) error {
	switch cause := context.Cause(b.hctx); {
	case cause == ErrIdleTimeout:
		return fmt.Errorf("no data for %v after %d bytes: %w", b.idle, b.n, ErrIdleTimeout)
	case cause == errRateCut:
		return fmt.Errorf("fewer than %d bytes in %v after %d bytes, below the minimum %d B/s: %w",
			b.need, b.window, b.n, b.minRate, ErrTooSlow)
	case cause == errDeadlineCut:
		return fmt.Errorf("not done within the total deadline of %v (%d bytes read): %w", b.deadlineIn, b.n, ErrTooSlow)
	case b.ctx.Err() != nil:
		if errors.Is(err, b.ctx.Err()) {
			return err
		}
		return fmt.Errorf("read body: %v: %w", err, b.ctx.Err())
	case errors.Is(err, io.ErrUnexpectedEOF):
		if b.want >= 0 {
			return fmt.Errorf("got %d of %d bytes: %w", b.n, b.want, ErrTruncated)
		}
		return fmt.Errorf("got %d bytes, then %v: %w", b.n, err, ErrTruncated)
	}
	return fmt.Errorf("read body: %w", err)
}

// Close closes the network body and reports the hop. Closing before the
// end gives up the connection; that is not reported as a failure of the
// origin.
func (b *body) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	res := b.res
	res.Cancelled = !b.eof && b.ctx.Err() != nil
	b.mu.Unlock()

	b.watch.Stop()
	if b.deadline != nil {
		b.deadline.Stop()
	}
	if b.throttle != nil {
		b.throttle.Close()
	}
	err := b.rc.Close()
	b.done(res)
	b.cancel(nil)
	return err
}

// drain reads a little of a body the caller will not see so its connection
// can be reused, then closes it. The status is the hop's result; a failure
// while draining is not.
func (b *body) drain() {
	b.max = drainLimit
	_, _ = io.Copy(io.Discard, b)
	b.mu.Lock()
	b.res.Err = nil
	b.mu.Unlock()
	_ = b.Close()
}
