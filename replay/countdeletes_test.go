package replay_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// A dry run counts delete jobs apart from fetches, in the total and per
// authority; a delete is a job of its own beside the fetch of its key.
func TestCountDeletesApart(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	for _, raw := range []string{
		`{"url":"http://127.0.0.1:18765/a"}`,
		`{"url":"http://127.0.0.1:18765/b"}`,
		`{"v":2,"op":"delete","url":"http://127.0.0.1:18765/a"}`,
		`{"url":"http://127.0.0.1:18766/c"}`,
	} {
		j, err := jobs.Parse([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, j.Subject(), data); err != nil {
			t.Fatal(err)
		}
	}
	got, err := replay.Count(ctx, js, replay.Start{}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got.Total != 4 || got.Deletes != 1 {
		t.Errorf("Total %d, Deletes %d; want 4 jobs of which 1 delete", got.Total, got.Deletes)
	}
	if a := got.ByAuthority["127.0.0.1:18765"]; a.Jobs != 3 || a.Deletes != 1 {
		t.Errorf("127.0.0.1:18765: %+v; want 3 jobs, 1 delete", a)
	}
	if a := got.ByAuthority["127.0.0.1:18766"]; a.Jobs != 1 || a.Deletes != 0 {
		t.Errorf("127.0.0.1:18766: %+v; want 1 job, no delete", a)
	}
}
