package replay

import (
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
type bounded struct {
	jetstream.Consumer
	lastSeq uint64
	skipped *atomic.Int64
	copies  *atomic.Int64 // the workers' copies up to lastSeq (jobs.IsCopy), first deliveries
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
			if err == nil && md.Sequence.Stream <= b.lastSeq && md.NumDelivered == 1 && b.copies != nil && jobs.IsCopy(m.Headers()) {
				b.copies.Add(1)
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
			out.ch <- m
		}
	}()
	return out
}

// boundedBatch is a MessageBatch without the messages past the bound. Its
// Error is the inner batch's, valid once Messages is closed, as for any
// batch.
type boundedBatch struct {
	in jetstream.MessageBatch
	ch chan jetstream.Msg
}

func (b *boundedBatch) Messages() <-chan jetstream.Msg { return b.ch }
func (b *boundedBatch) Error() error                   { return b.in.Error() }
