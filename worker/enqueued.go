package worker

import (
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go"
)

// enqueuedOf is when the submitted job behind delivery m was stored in
// MIRROR_JOBS: the instant a copy carries (jobs.HeaderEnqueued), else the
// delivery's own stream timestamp; zero when m is not from a stream.
func enqueuedOf(m Msg) time.Time {
	var h nats.Header
	if hm, ok := m.(interface{ Headers() nats.Header }); ok {
		h = hm.Headers()
	}
	var stored time.Time
	if md, err := m.Metadata(); err == nil {
		stored = md.Timestamp
	}
	return jobs.EnqueuedOf(h, stored)
}
