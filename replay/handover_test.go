package replay_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// TestHandoverKeepsAWindowPerAuthority: a replay handing its jobs to the
// pods has at most DefaultWindow copies of one authority out at once,
// each marked with its run, target and replayed sequence; it ends once a
// pod reported every job, and its entry in MIRROR_REPLAYS is gone then. The
// pod here is the test: it answers each copy it sees after a while.
func TestHandoverKeepsAWindowPerAuthority(t *testing.T) {
	js, nc := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	const n = 12
	for i := range n {
		host := "a.example"
		if i%4 == 3 {
			host = "b.example"
		}
		publishJobs(t, js, jobs.Job{URL: fmt.Sprintf("https://%s/%d", host, i)})
	}
	kv, err := replay.EnsureReplaysBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	out, maxOut, copies := map[string]int{}, map[string]int{}, 0
	sub, err := nc.Subscribe(jobs.JobsSubjectPrefix+">", func(m *nats.Msg) {
		run := m.Header.Get(jobs.HeaderReplay)
		if run == "" {
			return
		}
		j, err := jobs.Parse(m.Data)
		if err != nil {
			t.Errorf("copy: %v", err)
			return
		}
		of, _ := strconv.ParseUint(m.Header.Get(jobs.HeaderReplayOf), 10, 64)
		if run != "r1" || m.Header.Get(jobs.HeaderReplayTarget) != "file:///new" || of == 0 {
			t.Errorf("copy headers %v", m.Header)
		}
		a := j.Authority.String()
		mu.Lock()
		copies++
		out[a]++
		maxOut[a] = max(maxOut[a], out[a])
		mu.Unlock()
		time.AfterFunc(20*time.Millisecond, func() {
			mu.Lock()
			out[a]--
			mu.Unlock()
			b, _ := json.Marshal(jobs.ReplayDone{Of: of, JobID: j.ID, Authority: a, Outcome: "stored", Pod: "test"})
			nc.Publish(jobs.ReplayDoneSubject(run), b)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	var tally replay.Tally
	work := replay.Handover(js, kv, replay.HandoverOptions{Run: "r1", Target: "file:///new",
		OnDone: func(d jobs.ReplayDone) { tally.Add(d.Outcome) }})
	res, err := replay.Run(ctx, js, work, &replay.Options{Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.Jobs != n || tally.Summary().Stored != n || copies != n {
		t.Errorf("jobs %d, reported stored %d, copies %d; want %d each", res.Jobs, tally.Summary().Stored, copies, n)
	}
	for a, m := range maxOut {
		if m > replay.DefaultWindow {
			t.Errorf("%s: %d copies out at once, window %d", a, m, replay.DefaultWindow)
		}
	}
	if maxOut["a.example:443"] < 2 {
		t.Errorf("a.example had at most %d copies out: the window is not used", maxOut["a.example:443"])
	}
	if _, err := kv.Get(ctx, "r1"); err == nil {
		t.Error("the run's entry is left after the replay")
	}
}
