package bucket

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/mirror"
)

// storeFailures are the error codes that say the store itself fails, for
// every object alike: a job cannot cause them and its retry cannot cure
// them (ADR 0011). Any 5xx and any failure without a response (refused,
// reset, timed out, no such host) are failures of the store too.
var storeFailures = map[string]bool{
	"SlowDown":              true,
	"ServiceUnavailable":    true,
	"InternalError":         true,
	"RequestTimeout":        true,
	"AccessDenied":          true,
	"InvalidAccessKeyId":    true,
	"SignatureDoesNotMatch": true,
	"ExpiredToken":          true,
	"InvalidToken":          true,
	"NoSuchBucket":          true,
	"AllAccessDisabled":     true,
	"AccountProblem":        true,
	"QuotaExceeded":         true,
}

// throttles are the answers that ask a client to slow down.
var throttles = map[string]bool{"SlowDown": true, "ServiceUnavailable": true, "Throttling": true, "RequestLimitExceeded": true}

// errorCode returns the S3 error code and HTTP status of err (0 when no
// response came).
func errorCode(err error) (code string, status int) {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	return code, status
}

func isCode(err error, code string) bool {
	c, _ := errorCode(err)
	return c == code
}

func isNotFound(err error) bool {
	code, status := errorCode(err)
	return code == "NoSuchKey" || code == "NotFound" || (status == http.StatusNotFound && code != "NoSuchBucket" && code != "NoSuchUpload")
}

// isThrottle reports an answer that asks the client to slow down.
func isThrottle(err error) bool {
	code, status := errorCode(err)
	return throttles[code] || status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests
}

// classify wraps mirror.ErrUnavailable around an error of the store
// itself, named by its S3 code (or "unreachable", or the HTTP status), so
// that the worker pauses rather than blame the job. A cancelled context
// and an error about one object (a 400 for its key, NoSuchUpload after
// another process swept the upload) come back as they are.
func classify(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	code, status := errorCode(err)
	switch {
	case status == 0: // no response: refused, reset, timed out, no such host
		return fmt.Errorf("%w: unreachable: %w", mirror.ErrUnavailable, err)
	case storeFailures[code]:
		return fmt.Errorf("%w: %s: %w", mirror.ErrUnavailable, code, err)
	case status >= 500 || status == http.StatusForbidden || status == http.StatusTooManyRequests:
		return fmt.Errorf("%w: HTTP %d: %w", mirror.ErrUnavailable, status, err)
	}
	return err
}

// noticingRetryer is the SDK's retryer that tells the target of every
// throttled attempt, retried or not, so that its writes slow down.
type noticingRetryer struct {
	aws.Retryer
	notice func()
}

func (r *noticingRetryer) RetryDelay(attempt int, err error) (time.Duration, error) {
	if isThrottle(err) {
		r.notice()
	}
	return r.Retryer.RetryDelay(attempt, err)
}

// paceMin is the first spacing of writes after the store asked to slow
// down.
const paceMin = 50 * time.Millisecond

// pace spaces write requests to the store after it throttled: each
// SlowDown (or 503) doubles the spacing, from paceMin up to max, and each
// write that succeeds shortens it by a quarter, down to none. The zero
// value spaces nothing and never will. Safe for concurrent use.
type pace struct {
	max time.Duration // fixed

	mu    sync.Mutex
	delay time.Duration
	next  time.Time // earliest start of the next write
}

// reserve books the next write start at or after now and returns how long
// to wait for it.
func (p *pace) reserve(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delay == 0 {
		return 0
	}
	start := now
	if p.next.After(now) {
		start = p.next
	}
	p.next = start.Add(p.delay)
	return start.Sub(now)
}

// throttle lengthens the spacing; it returns the new spacing and whether
// writes were unspaced until now.
func (p *pace) throttle() (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	was := p.delay == 0
	p.delay = min(max(2*p.delay, paceMin), p.max)
	return p.delay, was
}

// ok shortens the spacing after a write the store took.
func (p *pace) ok() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delay == 0 {
		return
	}
	p.delay -= p.delay / 4
	if p.delay < paceMin {
		p.delay = 0
	}
}

// spacing returns the current spacing of writes.
func (p *pace) spacing() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// throttled is the retryer's notice of a throttled attempt.
func (t *Target) throttled() {
	if d, first := t.pace.throttle(); first {
		t.log.Warn().Str("target", t.spec).Str("spacing", d.String()).
			Msg("object store asks to slow down (SlowDown or 503): spacing writes until it takes them again")
	}
}

// waitPace waits for the next write start the pacing allows.
func (t *Target) waitPace(ctx context.Context) error {
	d := t.pace.reserve(t.clk.Now())
	if d <= 0 {
		return ctx.Err()
	}
	if !clock.Sleep(t.clk, d, ctx.Done()) {
		return ctx.Err()
	}
	return nil
}

// WriteSpacing returns the spacing of writes the store's throttling has
// imposed (0: none), for tests and status.
func (t *Target) WriteSpacing() time.Duration { return t.pace.spacing() }
