package replay

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestParseStart(t *testing.T) {
	tests := []struct {
		name                    string
		fromSeq, since, fromTim string
		want                    Start
		wantErr                 string // substring; "" means no error
	}{
		{name: "nothing is the beginning", want: Start{}},
		{name: "sequence", fromSeq: "42", want: Start{Seq: 42}},
		{name: "since hours", since: "24h", want: Start{Since: 24 * time.Hour}},
		{name: "since minutes and seconds", since: "1h30m", want: Start{Since: 90 * time.Minute}},
		{name: "since days", since: "7d", want: Start{Since: 7 * 24 * time.Hour}},
		{name: "since decimal days", since: "1.5d", want: Start{Since: 36 * time.Hour}},
		{name: "from time", fromTim: "2026-11-29T08:00:00Z", want: Start{Time: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}},
		{name: "from time with offset", fromTim: "2026-11-29T09:00:00+01:00", want: Start{Time: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}},

		{name: "sequence and since", fromSeq: "1", since: "1h", wantErr: "--from-seq and --since are mutually exclusive"},
		{name: "since and time", since: "1h", fromTim: "2026-11-29T08:00:00Z", wantErr: "--since and --from-time are mutually exclusive"},
		{name: "all three", fromSeq: "1", since: "1h", fromTim: "2026-11-29T08:00:00Z", wantErr: "--from-seq and --since and --from-time"},
		{name: "sequence zero", fromSeq: "0", wantErr: `--from-seq "0" is not a stream sequence`},
		{name: "sequence negative", fromSeq: "-3", wantErr: `--from-seq "-3" is not a stream sequence`},
		{name: "sequence words", fromSeq: "ten", wantErr: `--from-seq "ten"`},
		{name: "since garbage", since: "yesterday", wantErr: `--since "yesterday" is not a duration`},
		{name: "since without unit", since: "24", wantErr: `--since "24" is not a duration`},
		{name: "since negative", since: "-1h", wantErr: `--since "-1h" must be positive`},
		{name: "since zero", since: "0s", wantErr: `--since "0s" must be positive`},
		{name: "since zero days", since: "0d", wantErr: `--since "0d" must be positive`},
		{name: "since negative days", since: "-2d", wantErr: `--since "-2d" is not a duration`},
		{name: "since infinite days", since: "Infd", wantErr: `--since "Infd" is not a duration`},
		{name: "time not RFC 3339", fromTim: "2026-11-29 08:00", wantErr: `--from-time "2026-11-29 08:00" is not an RFC 3339 time`},
		{name: "time without zone", fromTim: "2026-11-29T08:00:00", wantErr: "is not an RFC 3339 time"},
		{name: "time in the future", fromTim: "2026-12-01T00:00:00Z", wantErr: "--from-time 2026-12-01T00:00:00Z is in the future"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseStart(tt.fromSeq, tt.since, tt.fromTim, t0)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseStart = %+v, %v; want an error containing %q", got, err, tt.wantErr)
				}
				if !errors.Is(err, ErrStart) {
					t.Errorf("error %v does not wrap ErrStart", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseStart: %v", err)
			}
			if !got.Time.Equal(tt.want.Time) || got.Seq != tt.want.Seq || got.Since != tt.want.Since {
				t.Errorf("ParseStart = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestStartValidate(t *testing.T) {
	tests := []struct {
		name  string
		start Start
		ok    bool
	}{
		{"zero", Start{}, true},
		{"seq", Start{Seq: 1}, true},
		{"since", Start{Since: time.Hour}, true},
		{"time", Start{Time: t0}, true},
		{"seq and time", Start{Seq: 1, Time: t0}, false},
		{"seq and since", Start{Seq: 1, Since: time.Hour}, false},
		{"negative since", Start{Since: -time.Hour}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.start.Validate()
			if (err == nil) != tt.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestStartDeliver(t *testing.T) {
	tests := []struct {
		name    string
		start   Start
		policy  jetstream.DeliverPolicy
		seq     uint64
		at      time.Time
		include []uint64 // of sequences 1..4 stored at t0-4h .. t0-1h
	}{
		{"beginning", Start{}, jetstream.DeliverAllPolicy, 0, time.Time{}, []uint64{1, 2, 3, 4}},
		{"sequence", Start{Seq: 3}, jetstream.DeliverByStartSequencePolicy, 3, time.Time{}, []uint64{3, 4}},
		{"since", Start{Since: 2 * time.Hour}, jetstream.DeliverByStartTimePolicy, 0, t0.Add(-2 * time.Hour), []uint64{3, 4}},
		{"time", Start{Time: t0.Add(-90 * time.Minute)}, jetstream.DeliverByStartTimePolicy, 0, t0.Add(-90 * time.Minute), []uint64{4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, seq, at := tt.start.deliver(t0)
			if p != tt.policy || seq != tt.seq {
				t.Errorf("deliver = %v, %d; want %v, %d", p, seq, tt.policy, tt.seq)
			}
			if tt.at.IsZero() != (at == nil) || at != nil && !at.Equal(tt.at) {
				t.Errorf("deliver start time = %v, want %v", at, tt.at)
			}
			var got []uint64
			for s := uint64(1); s <= 4; s++ {
				if tt.start.includes(s, t0.Add(-time.Duration(5-s)*time.Hour), t0) {
					got = append(got, s)
				}
			}
			if !equalSeqs(got, tt.include) {
				t.Errorf("includes %v, want %v", got, tt.include)
			}
		})
	}
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
