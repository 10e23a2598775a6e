package replay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Start is where in MIRROR_JOBS a replay begins. The zero Start is the
// beginning of the stream. At most one field may be set.
type Start struct {
	// Seq is the first stream sequence to replay (--from-seq).
	Seq uint64
	// Since replays the jobs stored within Since before the replay starts
	// (--since).
	Since time.Duration
	// Time replays the jobs stored at or after Time (--from-time).
	Time time.Time
}

// ErrStart is wrapped by every error about start options.
var ErrStart = errors.New("start")

// ParseStart builds a Start from the command-line spellings of --from-seq,
// --since and --from-time; an empty string is an option not given. Since
// takes a Go duration ("90m", "1h30m") or whole or decimal days ("2d",
// "1.5d"); Time takes RFC 3339 ("2026-11-29T08:00:00Z"). Errors wrap ErrStart
// and name the option at fault; now is when the replay starts, for refusing a
// --from-time in the future (a typo that would replay nothing).
func ParseStart(fromSeq, since, fromTime string, now time.Time) (Start, error) {
	var given []string
	for _, o := range []struct{ name, v string }{{"--from-seq", fromSeq}, {"--since", since}, {"--from-time", fromTime}} {
		if o.v != "" {
			given = append(given, o.name)
		}
	}
	if len(given) > 1 {
		return Start{}, fmt.Errorf("%w: %s are mutually exclusive: give one", ErrStart, strings.Join(given, " and "))
	}
	var s Start
	switch {
	case fromSeq != "":
		n, err := strconv.ParseUint(fromSeq, 10, 64)
		if err != nil || n == 0 {
			return Start{}, fmt.Errorf("%w: --from-seq %q is not a stream sequence (a whole number from 1)", ErrStart, fromSeq)
		}
		s.Seq = n
	case since != "":
		d, err := ParseSince(since)
		if err != nil {
			return Start{}, fmt.Errorf("%w: --since %q is not a duration (e.g. 90m, 24h, 7d)", ErrStart, since)
		}
		if d <= 0 {
			return Start{}, fmt.Errorf("%w: --since %q must be positive", ErrStart, since)
		}
		s.Since = d
	case fromTime != "":
		t, err := time.Parse(time.RFC3339, fromTime)
		if err != nil {
			return Start{}, fmt.Errorf("%w: --from-time %q is not an RFC 3339 time (e.g. 2026-11-29T08:00:00Z)", ErrStart, fromTime)
		}
		if t.After(now) {
			return Start{}, fmt.Errorf("%w: --from-time %s is in the future (now is %s)", ErrStart, fromTime, now.UTC().Format(time.RFC3339))
		}
		s.Time = t
	}
	if err := s.Validate(); err != nil {
		return Start{}, err
	}
	return s, nil
}

// ParseSince accepts a Go duration or a number of days ("7d"): the --since
// of replay and of dlq.
func ParseSince(v string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(v, "d"); ok {
		f, err := strconv.ParseFloat(days, 64)
		if err != nil || !(f >= 0 && f <= 100*365) { // also NaN and infinities
			return 0, errors.New("bad days")
		}
		return time.Duration(f * float64(24*time.Hour)), nil
	}
	return time.ParseDuration(v)
}

// Validate reports a Start that sets more than one field, a zero sequence
// or a non-positive Since. Errors wrap ErrStart.
func (s Start) Validate() error {
	n := 0
	if s.Seq != 0 {
		n++
	}
	if s.Since != 0 {
		n++
	}
	if !s.Time.IsZero() {
		n++
	}
	switch {
	case n > 1:
		return fmt.Errorf("%w: a sequence, a duration and a time are mutually exclusive: give one", ErrStart)
	case s.Since < 0:
		return fmt.Errorf("%w: --since %s must be positive", ErrStart, s.Since)
	}
	return nil
}

// IsZero reports whether s is the beginning of the stream.
func (s Start) IsZero() bool { return s == Start{} }

// String describes s for logs and the summary.
func (s Start) String() string {
	switch {
	case s.Seq != 0:
		return "from sequence " + strconv.FormatUint(s.Seq, 10)
	case s.Since != 0:
		return "since " + s.Since.String()
	case !s.Time.IsZero():
		return "from " + s.Time.Format(time.RFC3339)
	}
	return "from the beginning"
}

// deliver returns the deliver policy, start sequence and start time of a
// consumer beginning at s when the replay starts at now.
func (s Start) deliver(now time.Time) (jetstream.DeliverPolicy, uint64, *time.Time) {
	switch {
	case s.Seq != 0:
		return jetstream.DeliverByStartSequencePolicy, s.Seq, nil
	case s.Since != 0:
		t := now.Add(-s.Since)
		return jetstream.DeliverByStartTimePolicy, 0, &t
	case !s.Time.IsZero():
		t := s.Time
		return jetstream.DeliverByStartTimePolicy, 0, &t
	}
	return jetstream.DeliverAllPolicy, 0, nil
}

// includes reports whether a message at seq stored at ts is at or after s.
func (s Start) includes(seq uint64, ts, now time.Time) bool {
	p, from, at := s.deliver(now)
	switch p {
	case jetstream.DeliverByStartSequencePolicy:
		return seq >= from
	case jetstream.DeliverByStartTimePolicy:
		return !ts.Before(*at)
	}
	return true
}
