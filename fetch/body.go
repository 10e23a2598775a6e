package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
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
	hctx   context.Context // this hop's request, cancelled by the idle timer
	cancel context.CancelCauseFunc
	done   func(Result)
	timer  *time.Timer // cancels hctx with ErrIdleTimeout; armed during each Read

	mu     sync.Mutex
	n      int64
	err    error  // sticky read error
	res    Result // reported on Close; res.Err is a transport failure only
	eof    bool
	closed bool
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
	b.timer.Reset(b.idle)
	n, err := b.rc.Read(p)
	b.timer.Stop()

	b.mu.Lock()
	defer b.mu.Unlock()
	b.n += int64(n)
	switch {
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

// mapErrLocked names a transport read error. b.mu is held.
func (b *body) mapErrLocked(err error) error {
	switch {
	case context.Cause(b.hctx) == ErrIdleTimeout:
		return fmt.Errorf("no data for %v after %d bytes: %w", b.idle, b.n, ErrIdleTimeout)
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

	b.timer.Stop()
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
