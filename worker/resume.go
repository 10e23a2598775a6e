package worker

import (
	"cmp"
	"context"
	"io"
	"net/http"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/rs/zerolog"
)

// Resumer is a Target that keeps the start of a body whose transfer
// failed, so that the job's next attempt asks the origin only for the rest
// (Range with If-Range); *mirror.FileTarget is one. A Target without it
// fetches every attempt's body whole. See
// docs/adr/0035-downloads-resume-from-what-was-kept.md.
type Resumer interface {
	// Resume takes the start kept for key, fetched from url, for one
	// attempt; nil when there is none to resume.
	Resume(ctx context.Context, key, url string) (mirror.Kept, error)
	// PutResume is Put of a body whose first from bytes are k's (from is
	// k's size, or 0 for a whole body that replaces them).
	PutResume(ctx context.Context, key string, k mirror.Kept, from int64, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error)
}

// The results of a resumed request (resumes_total{result}).
const (
	ResumeResumed       = "resumed"        // 206: the origin sent the rest
	ResumeWhole         = "whole"          // 200: the range ignored, or the object changed (If-Range failed)
	ResumeUnsatisfiable = "unsatisfiable"  // 416: the start is dropped, the retry fetches the whole body
	ResumeRangeMismatch = "range_mismatch" // a 206 of another range: dropped likewise
	ResumeUnchanged     = "unchanged"      // 304: the stored object is current; the start is dropped
)

// keptFor is the start of j's body that an earlier attempt left in t,
// taken for this attempt, or nil. A target that cannot say is asked no
// more this attempt: the body comes whole.
func keptFor(ctx context.Context, t Target, j *heldJob, log zerolog.Logger) mirror.Kept {
	r, ok := t.(Resumer)
	if !ok {
		return nil
	}
	k, err := r.Resume(ctx, j.job.Target, jobURL(j))
	if err != nil {
		log.Debug().Err(err).Str("job", j.job.ID).Msg("look for a kept start")
		return nil
	}
	if k != nil && k.Partial().IfRange() == "" {
		k.Release()
		return nil
	}
	return k
}

// dropKept discards *k, if any: the start of a body no attempt will
// resume (its job is dead-lettered), rather than keep it for the sweep.
func dropKept(k *mirror.Kept) {
	if *k != nil {
		(*k).Discard()
		*k = nil
	}
}

// jobURL is the URL a job's object is recorded under: its origin's, for a
// continuation of a redirect, without userinfo.
func jobURL(j *heldJob) string { return authority.StripUserinfo(cmp.Or(j.origin, j.job.URL)) }

// countResume counts a resumed request's result, and for a 206 the bytes
// it did not fetch again.
func countResume(m *Metrics, result string, resp *fetch.Response) {
	m.Resumes.WithLabelValues(result).Inc()
	if result == ResumeResumed && resp != nil {
		m.ResumedBytes.Add(float64(resp.Offset))
	}
}

// resumeClass counts how the origin answered a request for the rest of
// *kept, drops *kept when the answer leaves it no use, and returns the
// class the answer is settled by: a 206 is a success. unsatisfiable
// reports a 416: the kept start is dropped, and the job's retry asks for
// the whole body.
func resumeClass(m *Metrics, resp *fetch.Response, class fetch.Class, kept *mirror.Kept) (_ fetch.Class, unsatisfiable bool) {
	switch {
	case resp.Status == http.StatusRequestedRangeNotSatisfiable:
		// The kept start is no start of what the origin holds now.
		countResume(m, ResumeUnsatisfiable, resp)
		(*kept).Discard()
		*kept = nil
		return class, true
	case resp.Offset > 0:
		countResume(m, ResumeResumed, resp)
		class = fetch.ClassSuccess
	case class == fetch.ClassSuccess:
		countResume(m, ResumeWhole, resp)
	case class == fetch.ClassNotModified:
		countResume(m, ResumeUnchanged, resp)
		(*kept).Discard()
		*kept = nil
	}
	return class, false
}
