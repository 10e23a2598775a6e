package replay

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// bounded is the replay consumer as the worker sees it: the stream as it
// was when the replay began. A job stored after lastSeq is acknowledged on
// the replay's own consumer (the live consumers are not touched) and never
// handed to the worker, so a replay neither does jobs that arrived during
// it nor waits for them. The worker pulls with Fetch and FetchNoWait; the
// other ways to pull (Messages, Consume, Next) are not bounded.
//
// Up to lastSeq, only the replay's jobs (jobs: the latest message of each
// job id, no copy) reach the worker; the other messages are acknowledged
// and skipped, so that a job is done once and counted once whatever copies
// of it parking, unparking or a hand-over left in the stream.
type bounded struct {
	jetstream.Consumer
	lastSeq uint64
	jobs    *jobSet
	skipped *atomic.Int64
	copies  *atomic.Int64 // messages up to lastSeq that are not jobs, first deliveries
}

func (b bounded) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	batch, err := b.Consumer.Fetch(n, opts...)
	if err != nil {
		return nil, err
	}
	return b.filter(batch), nil
}

func (b bounded) FetchNoWait(n int) (jetstream.MessageBatch, error) {
	batch, err := b.Consumer.FetchNoWait(n)
	if err != nil {
		return nil, err
	}
	return b.filter(batch), nil
}

func (b bounded) filter(in jetstream.MessageBatch) jetstream.MessageBatch {
	out := &boundedBatch{in: in, ch: make(chan jetstream.Msg)}
	go func() {
		defer close(out.ch)
		for m := range in.Messages() {
			md, err := m.Metadata()
			if err == nil && md.Sequence.Stream <= b.lastSeq && b.jobs != nil && !b.jobs.has(md.Sequence.Stream) {
				// A copy, or an earlier message of a job enqueued again.
				_ = m.Ack()
				if md.NumDelivered == 1 && b.copies != nil {
					b.copies.Add(1)
				}
				continue
			}
			if err == nil && md.Sequence.Stream > b.lastSeq {
				// An ack lost: redelivered after AckWait, and skipped again.
				_ = m.Ack()
				// The workers' copies (a replay's own among them) are no new jobs.
				if !jobs.IsCopy(m.Headers()) {
					b.skipped.Add(1)
				}
				continue
			}
			if err == nil && b.jobs != nil {
				m = jobMsg{Msg: m, seq: md.Sequence.Stream, set: b.jobs}
			}
			out.ch <- m
		}
	}()
	return out
}

// jobSet is a replay's jobs, by the stream sequence of their message, and
// which of them are done: the message acknowledged for good (acked or
// terminated, by the replay's worker or on a pod's report). A sequence is
// done once however often it is acknowledged. Safe for concurrent use.
type jobSet struct {
	mu   sync.Mutex
	todo map[uint64]jobState // by sequence
	done int64
}

// jobState is one job of a jobSet: its authority (shared among its
// authority's jobs) and whether it is done.
type jobState struct {
	auth string
	done bool
}

func newJobSet(byID map[string]*scannedJob) *jobSet {
	s := &jobSet{todo: make(map[uint64]jobState, len(byID))}
	for _, j := range byID {
		s.todo[j.lastSeq] = jobState{auth: j.auth}
	}
	return s
}

// left returns the jobs not done, per authority.
func (s *jobSet) left() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, j := range s.todo {
		if !j.done {
			out[j.auth]++
		}
	}
	return out
}

func (s *jobSet) has(seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.todo[seq]
	return ok
}

func (s *jobSet) finish(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if j, ok := s.todo[seq]; ok && !j.done {
		j.done = true
		s.todo[seq] = j
		s.done++
	}
}

// counts returns how many jobs there are and how many are done.
func (s *jobSet) counts() (total, done int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(len(s.todo)), s.done
}

// jobsOf returns the job set of Run's consumer c, nil for another consumer.
func jobsOf(c jetstream.Consumer) *jobSet {
	if b, ok := c.(bounded); ok {
		return b.jobs
	}
	return nil
}

// jobMsg is one of the replay's jobs as its worker sees it: its final
// acknowledgement marks the job done.
type jobMsg struct {
	jetstream.Msg
	seq uint64
	set *jobSet
}

func (m jobMsg) finished(err error) error {
	if err == nil {
		m.set.finish(m.seq)
	}
	return err
}

func (m jobMsg) Ack() error                          { return m.finished(m.Msg.Ack()) }
func (m jobMsg) DoubleAck(ctx context.Context) error { return m.finished(m.Msg.DoubleAck(ctx)) }
func (m jobMsg) Term() error                         { return m.finished(m.Msg.Term()) }
func (m jobMsg) TermWithReason(r string) error       { return m.finished(m.Msg.TermWithReason(r)) }

// boundedBatch is a MessageBatch without the messages past the bound. Its
// Error is the inner batch's, valid once Messages is closed, as for any
// batch.
type boundedBatch struct {
	in jetstream.MessageBatch
	ch chan jetstream.Msg
}

func (b *boundedBatch) Messages() <-chan jetstream.Msg { return b.ch }
func (b *boundedBatch) Error() error                   { return b.in.Error() }
