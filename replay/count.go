package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go/jetstream"
)

// Counts is what a dry run found.
type Counts struct {
	Total int
	// ByAuthority counts jobs per authority key (the subject's last token,
	// e.g. files_example_org_443).
	ByAuthority map[string]int
	// FirstSeq and LastSeq bound the stream sequences counted; zero when
	// nothing matched.
	FirstSeq, LastSeq uint64
}

// Count reports how many jobs a replay from start through the subject
// filters would re-drive, without fetching anything: the messages stored up
// to the stream's last matching sequence now, read headers only. now is
// when the replay would start (for Start.Since).
func Count(ctx context.Context, js jetstream.JetStream, start Start, subjects []string, now time.Time) (Counts, error) {
	if err := start.Validate(); err != nil {
		return Counts{}, err
	}
	c := Counts{ByAuthority: map[string]int{}}
	policy, seq, at := start.deliver(now)
	err := scan(ctx, js, jobs.JobsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects,
		DeliverPolicy:  policy,
		OptStartSeq:    seq,
		OptStartTime:   at,
		HeadersOnly:    true,
	}, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
		_, akey, err := jobs.ParseSubject(m.Subject())
		if err != nil {
			akey = jobs.InvalidToken // replayed all the same: the worker dead-letters it
		}
		c.ByAuthority[akey]++
		c.Total++
		if c.FirstSeq == 0 {
			c.FirstSeq = md.Sequence.Stream
		}
		c.LastSeq = md.Sequence.Stream
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("count jobs: %w", err)
	}
	return c, nil
}
