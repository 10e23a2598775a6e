package replay_test

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

func TestCount(t *testing.T) {
	js, _ := startJetStream(t)
	ctx := testContext(t)
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
		{name: "everything", now: now, want: map[string]int{"a_example_443": 10, "b_example_8080": 10, "c_example_80": 10}, first: 1, last: 30},
		{name: "one tenant", filter: replay.Filter{Tenants: []string{"zeta"}}, now: now,
			want: map[string]int{"a_example_443": 5, "b_example_8080": 5, "c_example_80": 5}, first: 2, last: 30},
		{name: "one authority", filter: replay.Filter{Authorities: auths(t, "b.example:8080")}, now: now,
			want: map[string]int{"b_example_8080": 10}, first: 2, last: 29},
		{name: "two authorities of one tenant", filter: replay.Filter{Tenants: []string{"acme"}, Authorities: auths(t, "https://a.example/x", "c.example:80")}, now: now,
			// acme is even i: a is i%3==0 → 0,6,12,18,24 (seq 1,7,...); c is i%3==2 → 2,8,14,20,26
			want: map[string]int{"a_example_443": 5, "c_example_80": 5}, first: 1, last: 27},
		{name: "from a sequence", start: replay.Start{Seq: 26}, now: now,
			want: map[string]int{"a_example_443": 1, "b_example_8080": 2, "c_example_80": 2}, first: 26, last: 30},
		{name: "from a sequence past the end", start: replay.Start{Seq: 31}, now: now, want: map[string]int{}},
		{name: "since, all of them", start: replay.Start{Since: time.Hour}, now: after, want: map[string]int{"a_example_443": 10, "b_example_8080": 10, "c_example_80": 10}, first: 1, last: 30},
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
			if !maps.Equal(got.ByAuthority, tt.want) {
				t.Errorf("ByAuthority = %v, want %v", got.ByAuthority, tt.want)
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
