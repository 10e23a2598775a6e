package replay_test

import (
	"testing"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// TestSeparateDeadLetters: a dead letter published through the replay's
// JetStream lands in the replay's stream, not in MIRROR_DLQ; other
// messages go where they always do.
func TestSeparateDeadLetters(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	if err := replay.EnsureDeadLetterStream(ctx, js, 0); err != nil {
		t.Fatal(err)
	}
	if err := replay.EnsureDeadLetterStream(ctx, js, 0); err != nil { // kept as it is
		t.Fatal(err)
	}
	sep := replay.SeparateDeadLetters(js)
	ack, err := jobs.PublishDeadLetter(ctx, sep, jobs.DeadLetter{JobID: "j1", Tenant: "default", Authority: "a.example:443", Reason: "http_404", Worker: "replay-x"})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != replay.DeadLetterStream {
		t.Errorf("dead letter stored in %s, want %s", ack.Stream, replay.DeadLetterStream)
	}
	publishJobs(t, sep, jobs.Job{URL: "https://a.example/x"})
	for name, want := range map[string]uint64{jobs.DLQStream: 0, replay.DeadLetterStream: 1, jobs.JobsStream: 1} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().State.Msgs; got != want {
			t.Errorf("%s holds %d messages, want %d", name, got, want)
		}
	}
}

// TestAPodsDeadLetterOfAReplayJob: a dead letter that names its replay run
// (a pod gave up a replay job, docs/adr/0025) goes to the replay's stream
// through any JetStream, not to MIRROR_DLQ.
func TestAPodsDeadLetterOfAReplayJob(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	if err := replay.EnsureDeadLetterStream(ctx, js, 0); err != nil {
		t.Fatal(err)
	}
	publishJobs(t, js, jobs.Job{URL: "https://a.example/x"}) // MIRROR_DLQ exists
	ack, err := jobs.PublishDeadLetter(ctx, js, jobs.DeadLetter{JobID: "j1", Tenant: "acme", Authority: "a.example:443",
		Reason: jobs.ReasonReplayTarget, Worker: "pod-1", Replay: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != replay.DeadLetterStream {
		t.Fatalf("dead letter stored in %s, want %s", ack.Stream, replay.DeadLetterStream)
	}
	s, err := js.Stream(ctx, replay.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if want := replay.DeadLetterPrefix + "acme.a_example_443"; m.Subject != want {
		t.Errorf("subject %s, want %s", m.Subject, want)
	}
}
