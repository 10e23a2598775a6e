package worker

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// TestLaneSkipPastSaysWhyItDidNotSkip: a skip that a lane's partition does not
// get is logged at debug with the partition and the reason (a flake of
// TestProcessCrashBeforeLaneSkip was a skip not done for lack of a backlog,
// which the log did not show); a partition without a lane has nothing to
// skip and logs nothing. Real JetStream, partitioned layout, nothing queued.
func TestLaneSkipPastSaysWhyItDidNotSkip(t *testing.T) {
	const part = 3
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	if _, err := jobs.EnsureWork(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		lane     bool
		catchups int
		want     map[string]any // fields of the one debug line; nil: no line
	}{
		{name: "no lane", want: nil},
		{name: "little ahead", lane: true,
			want: map[string]any{"partition": float64(part), "reason": "little ahead", "ahead": float64(0), "threshold": float64(6)}},
		{name: "catch-ups at their bound", lane: true, catchups: maxCatchups,
			want: map[string]any{"partition": float64(part), "reason": "catch-up consumers at their bound", "catchups": float64(maxCatchups)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			l := newLanes(laneDeps{js: js, log: zerolog.New(&buf).Level(zerolog.DebugLevel), backlog: 50})
			if c.lane {
				l.byKey[laneKey{part, "a.test:80"}] = &authLane{part: part, auth: "a.test:80", akey: "a.test:80"}
			}
			for i := range c.catchups {
				l.catchups[jobs.CatchupConsumer(part, uint64(i+1))] = &catchup{part: part}
			}
			if err := l.skipPast(ctx, part); err != nil {
				t.Fatalf("skipPast: %v", err)
			}
			if c.want == nil {
				if buf.Len() != 0 {
					t.Fatalf("logged %q, want nothing", buf.String())
				}
				return
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if buf.Len() == 0 || len(lines) != 1 {
				t.Fatalf("logged %q, want one line", buf.String())
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
				t.Fatal(err)
			}
			if got["level"] != "debug" || got["message"] != "partition consumer not skipped" {
				t.Errorf("logged %v, want the debug line %q", got, "partition consumer not skipped")
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Errorf("field %s = %v, want %v (line %v)", k, got[k], v, got)
				}
			}
		})
	}
}
