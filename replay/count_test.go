package replay_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

func TestCount(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	now := time.Now()

	empty, err := replay.Count(ctx, js, replay.Start{}, nil, now)
	if err != nil || empty.Total != 0 || len(empty.ByAuthority) != 0 {
		t.Fatalf("Count on an empty stream = %+v, %v", empty, err)
	}

	// Sequences 1..30: job i goes to tenant acme (even i) or zeta (odd i),
	// authority a.example:443 (i%3==0), b.example:8080 (1) or c.example:80 (2).
	hosts := []string{"https://a.example", "http://b.example:8080", "http://c.example"}
	var all []jobs.Job
	for i := range 30 {
		tenant := "acme"
		if i%2 == 1 {
			tenant = "zeta"
		}
		all = append(all, jobs.Job{URL: fmt.Sprintf("%s/f/%d", hosts[i%3], i), Tenant: tenant})
	}
	publishJobs(t, js, all...)
	after := time.Now()

	tests := []struct {
		name   string
		start  replay.Start
		filter replay.Filter
		now    time.Time
		want   map[string]int
		first  uint64
		last   uint64
	}{
		{name: "everything", now: now, want: map[string]int{"a.example:443": 10, "b.example:8080": 10, "c.example:80": 10}, first: 1, last: 30},
		{name: "one tenant", filter: replay.Filter{Tenants: []string{"zeta"}}, now: now,
			want: map[string]int{"a.example:443": 5, "b.example:8080": 5, "c.example:80": 5}, first: 2, last: 30},
		{name: "one authority", filter: replay.Filter{Authorities: auths(t, "b.example:8080")}, now: now,
			want: map[string]int{"b.example:8080": 10}, first: 2, last: 29},
		{name: "two authorities of one tenant", filter: replay.Filter{Tenants: []string{"acme"}, Authorities: auths(t, "https://a.example/x", "c.example:80")}, now: now,
			// acme is even i: a is i%3==0 → 0,6,12,18,24 (seq 1,7,...); c is i%3==2 → 2,8,14,20,26
			want: map[string]int{"a.example:443": 5, "c.example:80": 5}, first: 1, last: 27},
		{name: "from a sequence", start: replay.Start{Seq: 26}, now: now,
			want: map[string]int{"a.example:443": 1, "b.example:8080": 2, "c.example:80": 2}, first: 26, last: 30},
		{name: "from a sequence past the end", start: replay.Start{Seq: 31}, now: now, want: map[string]int{}},
		{name: "since, all of them", start: replay.Start{Since: time.Hour}, now: after, want: map[string]int{"a.example:443": 10, "b.example:8080": 10, "c.example:80": 10}, first: 1, last: 30},
		{name: "since, none of them", start: replay.Start{Since: time.Hour}, now: after.Add(2 * time.Hour), want: map[string]int{}},
		{name: "from a time after the last job", start: replay.Start{Time: after.Add(time.Second)}, now: after, want: map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subjects, err := tt.filter.Subjects()
			if err != nil {
				t.Fatal(err)
			}
			got, err := replay.Count(ctx, js, tt.start, subjects, tt.now)
			if err != nil {
				t.Fatalf("Count: %v", err)
			}
			jobsBy := map[string]int{}
			for a, n := range got.ByAuthority {
				jobsBy[a] = n.Jobs
				if n.Messages != n.Jobs || n.DeadLettered != 0 {
					t.Errorf("%s: %+v, want one message per job and none dead-lettered", a, n)
				}
			}
			if !maps.Equal(jobsBy, tt.want) {
				t.Errorf("jobs by authority = %v, want %v", jobsBy, tt.want)
			}
			total := 0
			for _, n := range tt.want {
				total += n
			}
			if got.Total != total || got.FirstSeq != tt.first || got.LastSeq != tt.last {
				t.Errorf("Total, FirstSeq, LastSeq = %d, %d, %d; want %d, %d, %d", got.Total, got.FirstSeq, got.LastSeq, total, tt.first, tt.last)
			}
		})
	}
}

// TestCountJobsNotMessages: a job enqueued twice (after the duplicate
// window, here by publishing without a message id) is one job of two
// messages; a dead-lettered job is counted as such, with its reason, and a
// job enqueued again after its dead letter is not.
func TestCountJobsNotMessages(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	a, err := jobs.Parse([]byte(`{"url":"http://127.0.0.1:18765/pub/hello.txt"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := jobs.Parse([]byte(`{"url":"http://127.0.0.1:18765/pub/other.txt"}`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := jobs.Parse([]byte(`{"url":"https://[::1]:8443/x"}`))
	if err != nil {
		t.Fatal(err)
	}
	pub := func(j jobs.Job) uint64 {
		t.Helper()
		data, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, j.Subject(), data) // no Nats-Msg-Id: never a duplicate
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	pub(a)
	seqB := pub(b)
	pub(a) // a again: 3 messages, 2 jobs on this authority
	pub(c)
	seqC := pub(c)
	pub(c) // c again after its dead letter below: not dead-lettered any more
	// Copies the workers wrote are not submitted jobs: a parked one brought
	// back, and a redirect's continuation (on another authority).
	for _, h := range []string{jobs.HeaderUnparked, jobs.HeaderContinues} {
		cont, err := jobs.Parse([]byte(`{"id":"` + a.ID + `","url":"http://127.0.0.1:18766/cdn/hello.txt"}`))
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(cont)
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(cont.Subject())
		m.Data = data
		m.Header.Set(h, a.URL)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []struct {
		j   jobs.Job
		seq uint64
	}{{b, seqB}, {c, seqC}} {
		dl := jobs.DeadLetter{JobID: d.j.ID, Authority: d.j.Authority.String(), Subject: d.j.Subject(), StreamSeq: d.seq, Reason: "destination_refused"}
		dl.SetJob([]byte(`{}`))
		if _, err := jobs.PublishDeadLetter(ctx, js, dl); err != nil {
			t.Fatal(err)
		}
	}

	got, err := replay.Count(ctx, js, replay.Start{}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got.Total != 3 || got.Messages != 6 || got.DeadLettered != 1 {
		t.Errorf("Total %d, Messages %d, DeadLettered %d; want 3 jobs, 6 messages, 1 dead-lettered", got.Total, got.Messages, got.DeadLettered)
	}
	want := map[string]replay.AuthorityCount{
		"127.0.0.1:18765": {Jobs: 2, Messages: 3, DeadLettered: 1, Reasons: map[string]int{"destination_refused": 1}},
		"[::1]:8443":      {Jobs: 1, Messages: 3},
	}
	if !reflect.DeepEqual(got.ByAuthority, want) {
		t.Errorf("ByAuthority = %+v, want %+v", got.ByAuthority, want)
	}
}
