package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// Counts is what a dry run found.
type Counts struct {
	// Total counts jobs: distinct job ids. The same job enqueued again
	// after the duplicate window is a second message of one job.
	Total int
	// Messages counts the stream messages selected, which is what the
	// replay re-drives (a job's second message costs a conditional
	// request).
	Messages int
	// DeadLettered counts the jobs whose latest message was dead-lettered.
	DeadLettered int
	// Deletes counts the delete jobs among Total (jobs.OpDelete): a replay
	// applies them in stream order, removing their keys from its target.
	Deletes int
	// ByAuthority counts per authority, keyed as people write it
	// ("files.example.org:443", "[::1]:8080"); a message that is not a valid
	// job is counted under InvalidJobs.
	ByAuthority map[string]AuthorityCount
	// FirstSeq and LastSeq bound the stream sequences counted; zero when
	// nothing matched.
	FirstSeq, LastSeq uint64
}

// AuthorityCount is one authority's share of a dry run.
type AuthorityCount struct {
	Jobs, Messages, DeadLettered int
	// Deletes counts the delete jobs among Jobs.
	Deletes int
	// Reasons counts the dead-lettered jobs by reason code.
	Reasons map[string]int
}

// InvalidJobs is the ByAuthority key of messages that are not valid jobs:
// a replay re-drives them and the worker dead-letters them (invalid_job).
const InvalidJobs = "(invalid jobs)"

// Count reports what a replay from start through the subject filters would
// re-drive, without fetching anything: the jobs among the messages stored
// up to the stream's last matching sequence now, and which of them were
// dead-lettered (from MIRROR_DLQ). now is when the replay would start (for
// Start.Since). It holds one entry per distinct job id in memory.
func Count(ctx context.Context, js jetstream.JetStream, start Start, subjects []string, now time.Time) (Counts, error) {
	c, byID, err := scanJobs(ctx, js, start, subjects, now, 0)
	if err != nil || c.Total == 0 {
		return c, err
	}
	dead, err := deadLetteredSeqs(ctx, js, c.FirstSeq)
	if err != nil {
		return c, err
	}
	for _, j := range byID {
		reason, ok := dead[j.lastSeq]
		if !ok {
			continue
		}
		a := c.ByAuthority[j.auth]
		a.DeadLettered++
		if a.Reasons == nil {
			a.Reasons = map[string]int{}
		}
		a.Reasons[reason]++
		c.ByAuthority[j.auth] = a
		c.DeadLettered++
	}
	return c, nil
}

// scannedJob is one job id a scan found: its authority and its latest
// message's sequence.
type scannedJob struct {
	auth    string
	lastSeq uint64
}

// scanJobs counts the jobs a replay from start through subjects selects
// among the messages stored up to upTo (0: the stream's end now), and maps
// each job id to its latest message. The workers' copies (jobs.IsCopy:
// parked and brought back, moved, continuations, replays' copies) are not
// jobs, and a job enqueued more than once is one job: this is the one
// count of jobs that a dry run, a replay's progress, its entry and its
// summary share (issue 37).
func scanJobs(ctx context.Context, js jetstream.JetStream, start Start, subjects []string, now time.Time, upTo uint64) (Counts, map[string]*scannedJob, error) {
	if err := start.Validate(); err != nil {
		return Counts{}, nil, err
	}
	c := Counts{ByAuthority: map[string]AuthorityCount{}}
	byID := map[string]*scannedJob{}
	auths := map[string]string{} // one copy of each authority string, shared by its jobs
	policy, seq, at := start.deliver(now)
	err := jobs.Scan(ctx, js, jobs.JobsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects,
		DeliverPolicy:  policy,
		OptStartSeq:    seq,
		OptStartTime:   at,
	}, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
		s := md.Sequence.Stream
		if upTo > 0 && s > upTo {
			return nil // stored after the replay began: the live workers'
		}
		if jobs.IsCopy(m.Headers()) {
			return nil // a copy the workers wrote, not a submitted job
		}
		auth, id, del := InvalidJobs, "", false
		if j, err := jobs.Parse(m.Data()); err == nil && jobs.CheckSubject(j, m.Subject()) == nil {
			auth, id, del = j.Authority.String(), j.ID, j.IsDelete()
		}
		if a, ok := auths[auth]; ok {
			auth = a
		} else {
			auths[auth] = auth
		}
		if id == "" { // not a job: each message counts on its own
			id = "seq:" + strconv.FormatUint(s, 10)
		}
		a := c.ByAuthority[auth]
		a.Messages++
		c.Messages++
		if j := byID[id]; j != nil {
			j.lastSeq = s
		} else {
			byID[id] = &scannedJob{auth: auth, lastSeq: s}
			a.Jobs++
			c.Total++
			if del {
				a.Deletes++
				c.Deletes++
			}
		}
		c.ByAuthority[auth] = a
		if c.FirstSeq == 0 {
			c.FirstSeq = s
		}
		c.LastSeq = s
		return nil
	})
	if err != nil {
		return c, nil, fmt.Errorf("count jobs: %w", err)
	}
	return c, byID, nil
}

// deadLetteredSeqs maps the MIRROR_JOBS sequence of every dead-lettered
// message at or after from to its reason.
func deadLetteredSeqs(ctx context.Context, js jetstream.JetStream, from uint64) (map[uint64]string, error) {
	out := map[uint64]string{}
	err := jobs.Scan(ctx, js, jobs.DLQStream, jetstream.OrderedConsumerConfig{}, func(m jetstream.Msg, _ *jetstream.MsgMetadata) error {
		var d struct {
			StreamSeq uint64 `json:"stream_seq"`
			Reason    string `json:"reason"`
		}
		if json.Unmarshal(m.Data(), &d) == nil && d.StreamSeq >= from {
			out[d.StreamSeq] = d.Reason
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	return out, nil
}
