package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/mirrorworker/mirrorworker/authority"
)

// This file holds the types other packages program against. Fields may be
// added; existing ones keep their meaning.

// Request is one object to fetch.
type Request struct {
	URL string
	// Header holds extra request headers (the job's allow-listed ones).
	Header http.Header
	// ETag and LastModified come from the stored metadata and make the
	// request conditional; a 304 answers it.
	ETag         string
	LastModified string
	// Size, when HasSize is set, is the body length the job expects. A
	// Content-Length that differs fails Do with ErrSizeMismatch before the
	// body is read, and reads stop one byte past Size (ErrSizeMismatch), so
	// an oversized answer costs at most Size+1 bytes. It also sets the
	// total deadline when the answer has no Content-Length.
	Size    int64
	HasSize bool
	// Hops is how many redirects were followed before URL, by an earlier
	// fetch that handed the rest over (a continuation job): they count
	// against MaxRedirects, and hop numbers go on from there.
	Hops int
	// From, when positive, asks for the body from byte From on (Range:
	// bytes=From-), to resume a transfer of which the first From bytes
	// are kept; IfRange is the validator they came with (a strong ETag or
	// a Last-Modified date), sent as If-Range so that a changed object
	// comes whole (200) rather than as the rest of another body. Without
	// IfRange no range is asked for. Size stays the whole body's size.
	// See Response.Offset.
	From    int64
	IfRange string
}

// Result is what one hop's request produced, reported to the Gate's done func.
type Result struct {
	Status    int
	Header    http.Header
	Err       error
	Cancelled bool
}

// Gate admits each hop's request before it starts (the first hop and every
// redirect hop, each by its own authority). It may block until the request
// may start. It returns a done func that the client calls exactly once with
// the hop's result, or an error that aborts the fetch (for example a pacer
// refusal, which the caller turns into a deferral).
type Gate func(ctx context.Context, hop int, a authority.Authority) (done func(Result), err error)

// Admitted returns g, calling admitted with the authority of every hop g
// admits, after it does (a caller recording when requests were let go).
func (g Gate) Admitted(admitted func(authority.Authority)) Gate {
	return func(ctx context.Context, hop int, a authority.Authority) (func(Result), error) {
		done, err := g(ctx, hop, a)
		if err == nil {
			admitted(a)
		}
		return done, err
	}
}

// Throttle spends the bytes of bodies against bandwidth caps (package
// bandwidth implements it). The client asks it for a BodyThrottle for each
// 2xx body it returns, by the authority of the hop that answered.
// Implementations are safe for concurrent use.
type Throttle interface {
	Body(a authority.Authority) BodyThrottle
}

// BodyThrottle is one body's share of the caps. The body calls Wait from
// its reads, one at a time, and Close once when it is closed.
type BodyThrottle interface {
	// Wait blocks until the body may read up to n more bytes (n > 0) and
	// returns how many, 1 to n; the body reads no more before it calls
	// Wait again. It fails only with ctx's error. Time spent in Wait is
	// not spent on the origin: it counts against neither the minimum
	// transfer rate, the idle timeout nor the total deadline.
	Wait(ctx context.Context, n int) (int, error)
	Close()
}

// GateError is a hop the Gate did not admit: Do returns it before that
// hop's request starts, with the URL the hop would have fetched, so that
// the caller can defer the job or hand the rest of the fetch to another
// worker. Err is the gate's error (errors.Is and errors.As see it).
type GateError struct {
	Hop       int
	Authority authority.Authority
	// URL is the hop's URL. Past hop 0 it has no userinfo: credentials
	// never follow a redirect.
	URL string
	Err error
}

func (e *GateError) Error() string {
	return fmt.Sprintf("admit hop %d to %s: %v", e.Hop, e.Authority, e.Err)
}

func (e *GateError) Unwrap() error { return e.Err }

// Response is the final hop's answer. Body is non-nil only for a 2xx status
// and must be closed; other bodies are drained (bounded) and closed by Do so
// the connection is reused.
type Response struct {
	Status   int
	Header   http.Header
	Body     io.ReadCloser
	FinalURL string
	Hops     int // requests made, including the first
	// CredentialVersion is the Version of the credential the final hop
	// carried (Options.Credentials); 0: none.
	CredentialVersion uint64
	// Offset is where Body starts in the whole body: Request.From when the
	// origin answered the range asked for (206 with a Content-Range from
	// From to the end), else 0 (a whole body: the origin ignored the range
	// or the If-Range validator no longer matches).
	Offset int64
}

// Class is how a final status affects the job.
type Class int

const (
	ClassSuccess     Class = iota // 2xx: store the body
	ClassNotModified              // 304: success without a rewrite
	ClassThrottled                // 429 (the pacer may also call 503/403 throttles: check its Verdict first)
	ClassTransient                // 408, 5xx: retry with backoff
	ClassPermanent                // other 4xx, unexpected 1xx/3xx: dead-letter
	ClassAuthFailed               // 401, 403 (unless the pacer calls it a throttle): the credential, not the job
)

var (
	// ErrTooManyRedirects: more than MaxRedirects hops. Permanent.
	ErrTooManyRedirects = errors.New("fetch: too many redirects")
	// ErrBodyTooLarge: the body exceeds MaxBodySize. Permanent.
	ErrBodyTooLarge = errors.New("fetch: body exceeds the maximum size")
	// ErrTruncated: the body ended before its Content-Length. Transient.
	ErrTruncated = errors.New("fetch: truncated body")
)

// RefusedError is a destination refused before dialling (link-local, cloud
// metadata, or loopback/private without AllowPrivate). Permanent.
type RefusedError struct {
	Host   string
	Addr   string // the address refused (literal or resolved)
	Reason string // "link_local", "metadata", "loopback", "private", "unspecified", "multicast"
}

func (e *RefusedError) Error() string {
	msg := "fetch: destination " + e.Host + " (" + e.Addr + ") refused: " + e.Reason
	if e.Reason != ReasonLinkLocal && e.Reason != ReasonMetadata {
		// The one refusal an operator can lift; say how.
		msg += " (to allow loopback and private destinations, run the worker with --allow-private-networks)"
	}
	return msg
}

var (
	// ErrInvalidURL: the URL, or a redirect's Location, is not an absolute
	// http or https URL with a valid authority. Permanent.
	ErrInvalidURL = errors.New("fetch: invalid url")
	// ErrIdleTimeout: a body read made no progress within the idle timeout.
	// Transient.
	ErrIdleTimeout = errors.New("fetch: body idle timeout")
	// ErrTooSlow: the body arrived below the minimum transfer rate over a
	// window, or was not done by the total deadline its expected size
	// allows. Transient (the origin may be faster later), but the fetch
	// slot is freed rather than held by a trickle.
	ErrTooSlow = errors.New("fetch: transfer too slow")
	// ErrSizeMismatch: the answer's Content-Length, or its body, differs
	// from Request.Size. Neither permanent nor transient on its own: the
	// caller decides how often an origin may answer with other bytes than
	// the job expects (docs/contract.md section 5: content_mismatch).
	ErrSizeMismatch = errors.New("fetch: body size differs from the expected size")
	// ErrRangeMismatch: a 206 answer to Request.From whose Content-Range is
	// not the rest of the body from From (another start, an end short of
	// the whole, another total than Request.Size). Transient: the caller
	// drops what it kept and fetches the whole body.
	ErrRangeMismatch = errors.New("fetch: partial content is not the range asked for")
)
