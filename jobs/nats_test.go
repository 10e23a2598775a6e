package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go/jetstream"
)

// startJetStream runs an embedded JetStream server for one test and returns
// a JetStream context on an in-process connection.
func startJetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	js, _ := brokertest.JetStream(t, brokertest.Start(t, broker.EmbeddedOptions{}))
	return js
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func streamConfig(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.Config
}

func TestEnsureStreams(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)

	for i := range 2 { // idempotent
		if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
			t.Fatalf("EnsureStreams #%d: %v", i+1, err)
		}
	}
	tests := []struct {
		name       string
		subject    string
		maxAge     time.Duration
		duplicates time.Duration
		discard    jetstream.DiscardPolicy
	}{
		{jobs.JobsStream, "mirror.jobs.>", 7 * 24 * time.Hour, 2 * time.Minute, jetstream.DiscardNew},
		{jobs.DLQStream, "mirror.dlq.>", 30 * 24 * time.Hour, 2 * time.Minute, jetstream.DiscardNew},
		{jobs.EventsStream, "mirror.events.>", 24 * time.Hour, 0, jetstream.DiscardOld},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := streamConfig(t, ctx, js, tt.name)
			if !reflect.DeepEqual(cfg.Subjects, []string{tt.subject}) {
				t.Errorf("subjects %v, want %s", cfg.Subjects, tt.subject)
			}
			if cfg.Retention != jetstream.LimitsPolicy || cfg.Storage != jetstream.FileStorage {
				t.Errorf("retention %v storage %v, want limits and file", cfg.Retention, cfg.Storage)
			}
			if cfg.MaxAge != tt.maxAge {
				t.Errorf("MaxAge %s, want %s", cfg.MaxAge, tt.maxAge)
			}
			if tt.duplicates != 0 && cfg.Duplicates != tt.duplicates {
				t.Errorf("Duplicates %s, want %s", cfg.Duplicates, tt.duplicates)
			}
			if cfg.Discard != tt.discard {
				t.Errorf("Discard %v, want %v", cfg.Discard, tt.discard)
			}
			if cfg.MaxBytes != -1 {
				t.Errorf("MaxBytes %d, want unlimited", cfg.MaxBytes)
			}
		})
	}
	kv, err := js.KeyValue(ctx, jobs.AttemptsBucket)
	if err != nil {
		t.Fatalf("bucket: %v", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 7*24*time.Hour {
		t.Errorf("bucket TTL %s, want 7 days", st.TTL())
	}

	// Changed limits are applied to the existing streams and bucket.
	changed := &jobs.StreamOptions{
		JobsMaxAge: 48 * time.Hour, JobsMaxBytes: 1 << 30, DLQMaxAge: 72 * time.Hour,
		EventsMaxAge: 2 * time.Hour, AttemptsTTL: 24 * time.Hour,
	}
	if err := jobs.EnsureStreams(ctx, js, changed); err != nil {
		t.Fatalf("EnsureStreams with changed limits: %v", err)
	}
	if cfg := streamConfig(t, ctx, js, jobs.JobsStream); cfg.MaxAge != 48*time.Hour || cfg.MaxBytes != 1<<30 {
		t.Errorf("jobs after update: MaxAge %s MaxBytes %d", cfg.MaxAge, cfg.MaxBytes)
	}
	if cfg := streamConfig(t, ctx, js, jobs.DLQStream); cfg.MaxAge != 72*time.Hour {
		t.Errorf("dlq after update: MaxAge %s", cfg.MaxAge)
	}
	if cfg := streamConfig(t, ctx, js, jobs.EventsStream); cfg.MaxAge != 2*time.Hour {
		t.Errorf("events after update: MaxAge %s", cfg.MaxAge)
	}
	if st, err := kv.Status(ctx); err != nil || st.TTL() != 24*time.Hour {
		t.Errorf("bucket after update: TTL %v, %v", st.TTL(), err)
	}

	// KeepExisting (enqueue) leaves the operator's limits alone but
	// recreates what is missing.
	if err := js.DeleteStream(ctx, jobs.DLQStream); err != nil {
		t.Fatal(err)
	}
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{KeepExisting: true}); err != nil {
		t.Fatalf("EnsureStreams KeepExisting: %v", err)
	}
	if cfg := streamConfig(t, ctx, js, jobs.JobsStream); cfg.MaxAge != 48*time.Hour {
		t.Errorf("KeepExisting changed jobs MaxAge to %s", cfg.MaxAge)
	}
	if cfg := streamConfig(t, ctx, js, jobs.DLQStream); cfg.MaxAge != jobs.DefaultDLQMaxAge {
		t.Errorf("recreated dlq MaxAge %s", cfg.MaxAge)
	}
}

func TestStreamOptionsRejected(t *testing.T) {
	tests := []struct {
		name string
		o    jobs.StreamOptions
	}{
		{"events history too short for a cold start", jobs.StreamOptions{EventsMaxAge: 30 * time.Minute}},
		{"duplicate window longer than max age", jobs.StreamOptions{JobsMaxAge: time.Minute, JobsDuplicates: 2 * time.Minute}},
		{"negative age", jobs.StreamOptions{DLQMaxAge: -time.Hour}},
		{"negative replicas", jobs.StreamOptions{Replicas: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := jobs.StreamConfigs(&tt.o); err == nil {
				t.Fatal("StreamConfigs accepted the options")
			}
		})
	}
}

func TestEnsureConsumer(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	c, err := jobs.EnsureConsumer(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	if cfg.Durable != jobs.ConsumerName || cfg.FilterSubject != "mirror.jobs.>" ||
		cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.DeliverPolicy != jetstream.DeliverAllPolicy ||
		cfg.MaxDeliver != -1 || cfg.AckWait != 60*time.Second || cfg.MaxAckPending != 20000 {
		t.Errorf("consumer config %+v", cfg)
	}

	// Updating an existing consumer: same durable, new limits and a narrower filter.
	o := &jobs.ConsumerOptions{AckWait: 30 * time.Second, MaxAckPending: 100,
		FilterSubjects: append(jobs.JobsSubjectFilters("*", "h_example_80"), jobs.JobsSubjectFilters("*", "h_example_443")...)}
	for range 2 {
		if c, err = jobs.EnsureConsumer(ctx, js, o); err != nil {
			t.Fatalf("update consumer: %v", err)
		}
	}
	if info, err = c.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if info.Config.AckWait != 30*time.Second || info.Config.MaxAckPending != 100 || len(info.Config.FilterSubjects) != 4 || info.Config.MaxDeliver != -1 {
		t.Errorf("updated consumer config %+v", info.Config)
	}
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	names := s.ConsumerNames(ctx)
	n := 0
	for range names.Name() {
		n++
	}
	if n != 1 {
		t.Errorf("%d consumers, want 1", n)
	}
}

func TestPublish(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	j := mustParse(t, `{"url":"https://H.example/a/b","tenant":"acme","headers":{"accept":"*/*"}}`)
	ack, err := jobs.Publish(ctx, js, j)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Duplicate || ack.Stream != jobs.JobsStream {
		t.Fatalf("first publish: %+v", ack)
	}
	again, err := jobs.Publish(ctx, js, j)
	if err != nil {
		t.Fatalf("second publish: %v", err)
	}
	if !again.Duplicate || again.Sequence != ack.Sequence {
		t.Fatalf("second publish of the same id: %+v, want a duplicate of seq %d", again, ack.Sequence)
	}

	// The worker sees the job on its subject, with the id header, and parses it back.
	c, err := jobs.EnsureConsumer(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(10)
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if len(got) != 1 {
		t.Fatalf("consumer got %d messages, want 1 (deduplicated)", len(got))
	}
	m := got[0]
	// Stored with the authority's partition as a fifth token.
	want := fmt.Sprintf("mirror.jobs.acme.h_example_443.%d", jobs.Partition("h_example_443", jobs.DefaultPartitions))
	if m.Subject() != want || m.Headers().Get(jetstream.MsgIDHeader) != j.ID {
		t.Errorf("subject %q, Nats-Msg-Id %q", m.Subject(), m.Headers().Get(jetstream.MsgIDHeader))
	}
	back, err := jobs.Parse(m.Data())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, j) {
		t.Errorf("parsed back %+v, want %+v", back, j)
	}
	if err := jobs.CheckSubject(back, m.Subject()); err != nil {
		t.Error(err)
	}

	// A hand-built job gets its defaults; an invalid one is refused before publishing.
	hand, err := jobs.Publish(ctx, js, jobs.Job{URL: "http://h.example/c"})
	if err != nil || hand.Duplicate {
		t.Fatalf("hand-built job: %+v, %v", hand, err)
	}
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(ctx, hand.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"v":1,"id":"` + jobs.DefaultID("http://h.example/c", "h.example/c") + `","url":"http://h.example/c","target":"h.example/c","tenant":"default","kind":"artifact"}`; string(raw.Data) != want {
		t.Errorf("body\n %s\nwant\n %s", raw.Data, want)
	}
	_, err = jobs.Publish(ctx, js, jobs.Job{URL: "http://h.example/c", Target: "../x"})
	var ie *jobs.InvalidError
	if !errors.As(err, &ie) || ie.Field != "target" {
		t.Errorf("publishing an invalid job: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("stream holds %d messages, want 2", info.State.Msgs)
	}
}

func TestPublishDeadLetter(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	dlq, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	tests := []struct {
		name        string
		dl          jobs.DeadLetter
		original    []byte
		wantSubject string
		wantJSON    bool // the original is kept as JSON (else as bytes)
	}{
		{
			name: "http 404 after attempts",
			dl: jobs.DeadLetter{JobID: "abc", Tenant: "acme", Authority: "h.example:443", StreamSeq: 7,
				Reason: jobs.HTTPReason(404), Detail: "not found", LastStatus: 404,
				Attempts: []jobs.Attempt{{Time: t0, Reason: "http_503", Status: 503}, {Time: t0.Add(time.Minute), Reason: "http_404", Status: 404}},
				First:    t0, Last: t0.Add(time.Minute), Worker: "w1"},
			original:    []byte(`{"url":"https://h.example/x","tenant":"acme","id":"abc"}`),
			wantSubject: "mirror.dlq.acme.h_example_443",
			wantJSON:    true,
		},
		{
			name:        "unparseable job on a valid subject",
			dl:          jobs.DeadLetter{Subject: "mirror.jobs.acme.h_example_80", StreamSeq: 8, Reason: jobs.ReasonInvalidJob, Detail: "malformed JSON"},
			original:    []byte(`{"url":`),
			wantSubject: "mirror.dlq.acme.h_example_80",
		},
		{
			name:        "binary garbage on a garbage subject",
			dl:          jobs.DeadLetter{Subject: "mirror.jobs.X.Y.Z", StreamSeq: 9, Reason: jobs.ReasonInvalidJob},
			original:    []byte{0xff, 0x00, '{'},
			wantSubject: "mirror.dlq.invalid.invalid",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.dl
			d.SetJob(tt.original)
			ack, err := jobs.PublishDeadLetter(ctx, js, d)
			if err != nil {
				t.Fatal(err)
			}
			if ack.Duplicate || ack.Stream != jobs.DLQStream {
				t.Fatalf("ack %+v", ack)
			}
			retry, err := jobs.PublishDeadLetter(ctx, js, d)
			if err != nil {
				t.Fatal(err)
			}
			if !retry.Duplicate || retry.Sequence != ack.Sequence {
				t.Errorf("retried publish %+v, want a duplicate of %d", retry, ack.Sequence)
			}
			raw, err := dlq.GetMsg(ctx, ack.Sequence)
			if err != nil {
				t.Fatal(err)
			}
			if raw.Subject != tt.wantSubject {
				t.Errorf("subject %q, want %q", raw.Subject, tt.wantSubject)
			}
			var got jobs.DeadLetter
			if err := json.Unmarshal(raw.Data, &got); err != nil {
				t.Fatalf("decode record: %v", err)
			}
			if tt.wantJSON {
				if string(got.Job) != string(tt.original) || got.JobBytes != nil {
					t.Errorf("job %s bytes %q, want the original as JSON", got.Job, got.JobBytes)
				}
			} else if string(got.JobBytes) != string(tt.original) || got.Job != nil {
				t.Errorf("job %s bytes %q, want the original as bytes", got.Job, got.JobBytes)
			}
			if !reflect.DeepEqual(got, d) {
				t.Errorf("record\n %+v\nwant\n %+v", got, d)
			}
		})
	}

	// The same job dead-lettered again from another stream sequence (it was
	// enqueued again) is a new record.
	d := tests[0].dl
	d.SetJob(tests[0].original)
	d.StreamSeq = 70
	ack, err := jobs.PublishDeadLetter(ctx, js, d)
	if err != nil || ack.Duplicate {
		t.Errorf("new stream sequence: %+v, %v", ack, err)
	}
	// A record without a reason is refused.
	if _, err := jobs.PublishDeadLetter(ctx, js, jobs.DeadLetter{JobID: "x"}); err == nil {
		t.Error("a dead letter without a reason was published")
	}
}

func TestDeadLetterSetJobTruncates(t *testing.T) {
	big := make([]byte, jobs.MaxDeadLetterJob+10)
	var d jobs.DeadLetter
	d.SetJob(big)
	if !d.JobTruncated || len(d.JobBytes) != jobs.MaxDeadLetterJob || d.JobLen != len(big) || d.Job != nil {
		t.Errorf("truncated %v, %d bytes kept, len %d", d.JobTruncated, len(d.JobBytes), d.JobLen)
	}
}
