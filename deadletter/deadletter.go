// Package deadletter reads the dead-letter records of MIRROR_DLQ and
// requeues their jobs: what `mirrorworker dlq` does, without the nats CLI or
// knowledge of the record format.
//
// It does not decide why a job failed (the worker does) and never deletes
// a record: a requeued job's record stays as its history.
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// Record is one dead letter as stored: its stream sequence and time, and
// the record the worker published.
type Record struct {
	Seq     uint64            `json:"seq"`
	Time    time.Time         `json:"time"`
	Subject string            `json:"subject"`
	Record  jobs.DeadLetter   `json:"record"`
	Headers map[string]string `json:"headers,omitempty"`
	// Generation is how many times the job was requeued before this record:
	// 0 for a job as its producer enqueued it.
	Generation int `json:"generation"`
}

// Query selects dead letters. The zero Query selects all.
type Query struct {
	Filter  replay.Filter // tenants and authorities, by subject
	Reasons []string      // reason codes; empty: every reason
	Since   time.Time     // records stored at or after; zero: from the first
	Until   time.Time     // records stored before; zero: up to the last
	Limit   int           // at most this many (the oldest first); 0: no limit
}

// Subjects returns the MIRROR_DLQ subject filters of q.
func (q Query) Subjects() ([]string, error) {
	subs, err := q.Filter.Subjects()
	if err != nil {
		return nil, err
	}
	for i, s := range subs {
		subs[i] = jobs.DLQSubjectPrefix + strings.TrimPrefix(s, jobs.JobsSubjectPrefix)
	}
	return subs, nil
}

func (q Query) match(r Record) bool {
	if !q.Until.IsZero() && !r.Time.Before(q.Until) {
		return false
	}
	if len(q.Reasons) == 0 {
		return true
	}
	for _, reason := range q.Reasons {
		if r.Record.Reason == reason {
			return true
		}
	}
	return false
}

// List returns the records q selects, oldest first. It reads MIRROR_DLQ
// with an ordered consumer of its own, which the server removes afterwards.
func List(ctx context.Context, js jetstream.JetStream, q Query) ([]Record, error) {
	subs, err := q.Subjects()
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", jobs.DLQStream, err)
	}
	if s.CachedInfo().State.Msgs == 0 {
		return nil, nil
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: subs, DeliverPolicy: jetstream.DeliverAllPolicy}
	if !q.Since.IsZero() {
		since := q.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	c, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", jobs.DLQStream, err)
	}
	// Nothing past the last record now: a dead letter published while we
	// read is for the next listing.
	last := s.CachedInfo().State.LastSeq
	var out []Record
	for {
		batch, err := c.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", jobs.DLQStream, err)
		}
		got, done := 0, false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			if md.Sequence.Stream > last {
				done = true
				continue
			}
			r := decode(md.Sequence.Stream, md.Timestamp, m.Subject(), m.Headers(), m.Data())
			if q.match(r) {
				out = append(out, r)
				if q.Limit > 0 && len(out) >= q.Limit {
					return out, nil
				}
			}
			if md.NumPending == 0 || md.Sequence.Stream >= last {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("read %s: %w", jobs.DLQStream, err)
		}
		if done || got == 0 {
			return out, ctx.Err()
		}
	}
}

// Get returns the record at stream sequence seq.
func Get(ctx context.Context, js jetstream.JetStream, seq uint64) (Record, error) {
	s, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		return Record{}, fmt.Errorf("stream %s: %w", jobs.DLQStream, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Record{}, fmt.Errorf("no dead letter at sequence %d of %s (list them with 'mirrorworker dlq list')", seq, jobs.DLQStream)
		}
		return Record{}, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	return decode(m.Sequence, m.Time, m.Subject, m.Header, m.Data), nil
}

func decode(seq uint64, t time.Time, subject string, h map[string][]string, data []byte) Record {
	r := Record{Seq: seq, Time: t.UTC(), Subject: subject}
	if err := json.Unmarshal(data, &r.Record); err != nil {
		r.Record.Reason = "unreadable_record"
		r.Record.Detail = err.Error()
	}
	for k, v := range h {
		if len(v) > 0 && k != jetstream.MsgIDHeader {
			if r.Headers == nil {
				r.Headers = map[string]string{}
			}
			r.Headers[k] = v[0]
		}
	}
	_, r.Generation = SplitID(r.Record.JobID)
	return r
}

// Provenance headers of a requeued job.
const (
	HeaderRequeuedFrom  = "Mirrorworker-Requeued-From"   // MIRROR_DLQ:<seq>
	HeaderOriginalJobID = "Mirrorworker-Original-Job-Id" // the id the producer gave
	HeaderRequeueReason = "Mirrorworker-Requeue-Reason"  // the reason of the record requeued
)

// requeueSuffix marks a requeued job's id: <original id>.rq<generation>.
var requeueSuffix = regexp.MustCompile(`\.rq([0-9]{1,3})$`)

// SplitID splits a job id into the id its producer gave and the number of
// times it was requeued (0 for an original).
func SplitID(id string) (base string, generation int) {
	m := requeueSuffix.FindStringSubmatchIndex(id)
	if m == nil {
		return id, 0
	}
	n, _ := strconv.Atoi(id[m[2]:m[3]])
	return id[:m[0]], n
}

// DefaultMaxGeneration bounds how often one job may be requeued.
const DefaultMaxGeneration = 5

// ErrNotRequeueable is wrapped by every reason a record cannot be requeued.
var ErrNotRequeueable = errors.New("cannot requeue")

// Requeued is a job built from a dead letter, ready to publish.
type Requeued struct {
	From Record
	Job  jobs.Job
}

// Prepare builds the job that requeues r: the original job under a fresh
// id, <original id>.rq<generation+1>, so that the stream's duplicate
// window does not swallow it and it gets a fresh failure budget. A record
// whose job is not valid (invalid_job, truncated) or that was requeued
// maxGen times already (0: DefaultMaxGeneration) is refused.
func Prepare(r Record, maxGen int) (Requeued, error) {
	if maxGen <= 0 {
		maxGen = DefaultMaxGeneration
	}
	if len(r.Record.Job) == 0 {
		return Requeued{}, fmt.Errorf("%w dead letter %d: its job is not valid JSON (reason %s); fix it at its producer", ErrNotRequeueable, r.Seq, r.Record.Reason)
	}
	j, err := jobs.Parse(r.Record.Job)
	if err != nil {
		return Requeued{}, fmt.Errorf("%w dead letter %d: %w; fix the job at its producer", ErrNotRequeueable, r.Seq, err)
	}
	base, gen := SplitID(j.ID)
	if gen >= maxGen {
		return Requeued{}, fmt.Errorf("%w dead letter %d: job %s was requeued %d times already (--max-generation %d)", ErrNotRequeueable, r.Seq, base, gen, maxGen)
	}
	j.ID = base + ".rq" + strconv.Itoa(gen+1)
	if len(j.ID) > jobs.MaxIDLen {
		return Requeued{}, fmt.Errorf("%w dead letter %d: job id %q is too long to mark as requeued", ErrNotRequeueable, r.Seq, base)
	}
	return Requeued{From: r, Job: j}, nil
}

// Publish publishes rq on MIRROR_JOBS with its provenance headers and waits
// for the ack. Requeueing the same record twice within the stream's
// duplicate window publishes it once (the ack says Duplicate).
func Publish(ctx context.Context, js jetstream.JetStream, rq Requeued) (*jetstream.PubAck, error) {
	m, _, err := jobs.NewMsg(rq.Job)
	if err != nil {
		return nil, err
	}
	base, _ := SplitID(rq.Job.ID)
	m.Header.Set(HeaderRequeuedFrom, jobs.DLQStream+":"+strconv.FormatUint(rq.From.Seq, 10))
	m.Header.Set(HeaderOriginalJobID, base)
	m.Header.Set(HeaderRequeueReason, rq.From.Record.Reason)
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("requeue dead letter %d as job %s: %w", rq.From.Seq, rq.Job.ID, err)
	}
	return ack, nil
}
