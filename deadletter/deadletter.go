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

	"github.com/nats-io/nats.go"
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
	// Requeued is how many times this record was requeued (by Publish).
	Requeued int `json:"requeued"`
}

// Requests is how many requests the job cost before it was given up: its
// recorded attempts, or 1 when none is recorded but the origin answered
// (a 404 ends a job at its first answer, with no retry to record).
func (r Record) Requests() int {
	if n := len(r.Record.Attempts); n > 0 || r.Record.LastStatus == 0 {
		return n
	}
	return 1
}

// RequeueMarkPrefix starts the subject of the mark Publish leaves in
// MIRROR_DLQ for every record it requeues: RequeueMarkPrefix + the
// record's sequence. Its token is upper case, which no tenant is, so no
// dead letter's subject is one.
const RequeueMarkPrefix = jobs.DLQSubjectPrefix + "REQUEUED."

// IsMark reports whether subject is a requeue mark's, not a dead letter's.
func IsMark(subject string) bool {
	return strings.HasPrefix(subject, RequeueMarkPrefix) || strings.HasPrefix(subject, markPrefix(true))
}

// ErrNotMarked is returned with the ack when a job was requeued but the
// mark that counts it could not be written: the job is queued, only
// 'dlq list' shows one requeue too few.
var ErrNotMarked = errors.New("requeued, but not marked as requeued")

// requeueCounts returns how many marks each record of seqs has.
func requeueCounts(ctx context.Context, s jetstream.Stream) (map[uint64]int, error) {
	prefix := markPrefix(s.CachedInfo().Config.Name == replay.DeadLetterStream)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, fmt.Errorf("read requeue marks: %w", err)
	}
	out := map[uint64]int{}
	for subj, n := range info.State.Subjects {
		if seq, err := strconv.ParseUint(strings.TrimPrefix(subj, prefix), 10, 64); err == nil {
			out[seq] = int(n)
		}
	}
	return out, nil
}

// Query selects dead letters. The zero Query selects all of MIRROR_DLQ.
type Query struct {
	// Replays reads the dead letters of replays (replay.DeadLetterStream)
	// instead of the live pipeline's.
	Replays bool
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
		subs[i] = prefixOf(q.Replays) + strings.TrimPrefix(s, jobs.JobsSubjectPrefix)
	}
	return subs, nil
}

// StreamOf is the stream of the live dead letters, or of replays'.
func StreamOf(replays bool) string {
	if replays {
		return replay.DeadLetterStream
	}
	return jobs.DLQStream
}

func prefixOf(replays bool) string {
	if replays {
		return replay.DeadLetterPrefix
	}
	return jobs.DLQSubjectPrefix
}

// markPrefix is the subject prefix of requeue marks in the stream of
// replays or of the live dead letters.
func markPrefix(replays bool) string {
	return strings.Replace(RequeueMarkPrefix, jobs.DLQSubjectPrefix, prefixOf(replays), 1)
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
	name := StreamOf(q.Replays)
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) && q.Replays {
		return nil, nil // no replay has dead-lettered anything yet
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
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
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	// Nothing past the last record now: a dead letter published while we
	// read is for the next listing.
	last := s.CachedInfo().State.LastSeq
	var out []Record
	for {
		batch, err := c.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
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
			if IsMark(m.Subject()) {
				if md.NumPending == 0 || md.Sequence.Stream >= last {
					done = true
				}
				continue
			}
			r := decode(md.Sequence.Stream, md.Timestamp, m.Subject(), m.Headers(), m.Data())
			if q.match(r) {
				out = append(out, r)
				if q.Limit > 0 && len(out) >= q.Limit {
					return withRequeues(ctx, s, out)
				}
			}
			if md.NumPending == 0 || md.Sequence.Stream >= last {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		if done || got == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return withRequeues(ctx, s, out)
		}
	}
}

// withRequeues sets each record's Requeued from the marks.
func withRequeues(ctx context.Context, s jetstream.Stream, recs []Record) ([]Record, error) {
	if len(recs) == 0 {
		return recs, nil
	}
	counts, err := requeueCounts(ctx, s)
	if err != nil {
		return nil, err
	}
	for i := range recs {
		recs[i].Requeued = counts[recs[i].Seq]
	}
	return recs, nil
}

// Get returns the record at stream sequence seq of MIRROR_DLQ, or of the
// replays' dead letters.
func Get(ctx context.Context, js jetstream.JetStream, seq uint64, replays bool) (Record, error) {
	name := StreamOf(replays)
	s, err := js.Stream(ctx, name)
	if err != nil {
		return Record{}, fmt.Errorf("stream %s: %w", name, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Record{}, fmt.Errorf("no dead letter at sequence %d of %s (list them with 'mirrorworker dlq list')", seq, name)
		}
		return Record{}, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	if IsMark(m.Subject) {
		return Record{}, fmt.Errorf("sequence %d of %s is the mark of a requeue, not a dead letter (list them with 'mirrorworker dlq list')", seq, name)
	}
	recs, err := withRequeues(ctx, s, []Record{decode(m.Sequence, m.Time, m.Subject, m.Header, m.Data)})
	if err != nil {
		return Record{}, err
	}
	return recs[0], nil
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
	HeaderRequeuedAs    = "Mirrorworker-Requeued-As"     // on a requeue mark: the new job's id
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
	from := jobs.DLQStream
	if strings.HasPrefix(rq.From.Subject, replay.DeadLetterPrefix) {
		from = replay.DeadLetterStream
	}
	m.Header.Set(HeaderRequeuedFrom, from+":"+strconv.FormatUint(rq.From.Seq, 10))
	m.Header.Set(HeaderOriginalJobID, base)
	m.Header.Set(HeaderRequeueReason, rq.From.Record.Reason)
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("requeue dead letter %d as job %s: %w", rq.From.Seq, rq.Job.ID, err)
	}
	// The mark counts the requeue in 'dlq list'. Its message id makes a
	// second requeue of the same record within the duplicate window, which
	// published no job, leave no second mark either.
	seq := strconv.FormatUint(rq.From.Seq, 10)
	mark := nats.NewMsg(markPrefix(strings.HasPrefix(rq.From.Subject, replay.DeadLetterPrefix)) + seq)
	mark.Header.Set(jetstream.MsgIDHeader, "requeue:"+seq+":"+rq.Job.ID)
	mark.Header.Set(HeaderRequeuedAs, rq.Job.ID)
	mark.Data, _ = json.Marshal(map[string]any{"requeued_from": rq.From.Seq, "job_id": rq.Job.ID, "jobs_seq": ack.Sequence})
	if _, err := js.PublishMsg(ctx, mark); err != nil {
		return ack, fmt.Errorf("%w: dead letter %d: %w", ErrNotMarked, rq.From.Seq, err)
	}
	return ack, nil
}
