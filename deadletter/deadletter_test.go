package deadletter_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/deadletter"
	"github.com/mirrorworker/mirrorworker/jobs"
)

func TestSplitID(t *testing.T) {
	tests := []struct {
		id, base string
		gen      int
	}{
		{"abc", "abc", 0},
		{"abc.rq1", "abc", 1},
		{"abc.rq12", "abc", 12},
		{"a.rq1.rq2", "a.rq1", 2},
		{"abc.rq", "abc.rq", 0},
		{"abc.rqx", "abc.rqx", 0},
	}
	for _, tt := range tests {
		base, gen := deadletter.SplitID(tt.id)
		if base != tt.base || gen != tt.gen {
			t.Errorf("SplitID(%q) = %q, %d; want %q, %d", tt.id, base, gen, tt.base, tt.gen)
		}
	}
}

func TestPrepare(t *testing.T) {
	rec := func(job string) deadletter.Record {
		var d jobs.DeadLetter
		d.SetJob([]byte(job))
		d.Reason = "http_404"
		return deadletter.Record{Seq: 7, Record: d}
	}
	tests := []struct {
		name    string
		r       deadletter.Record
		maxGen  int
		wantID  string
		wantErr string
	}{
		{name: "original", r: rec(`{"id":"j1","url":"https://a.example/x"}`), wantID: "j1.rq1"},
		{name: "requeued once", r: rec(`{"id":"j1.rq1","url":"https://a.example/x"}`), wantID: "j1.rq2"},
		{name: "default id", r: rec(`{"url":"https://a.example/x","target":"x"}`), wantID: ".rq1"},
		{name: "generation limit", r: rec(`{"id":"j1.rq3","url":"https://a.example/x"}`), maxGen: 3, wantErr: "requeued 3 times"},
		{name: "invalid job", r: rec(`{"url":"ftp://a.example/x"}`), wantErr: "fix the job"},
		{name: "not JSON", r: rec("\xff\xfe"), wantErr: "not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rq, err := deadletter.Prepare(tt.r, tt.maxGen)
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, deadletter.ErrNotRequeueable) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrNotRequeueable mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(rq.Job.ID, tt.wantID) {
				t.Errorf("id %q, want suffix %q", rq.Job.ID, tt.wantID)
			}
			if rq.Job.URL != "https://a.example/x" || rq.From.Seq != 7 {
				t.Errorf("job %+v from %d", rq.Job, rq.From.Seq)
			}
		})
	}
}

func TestRequests(t *testing.T) {
	tests := []struct {
		name string
		d    jobs.DeadLetter
		want int
	}{
		{"a 404 at the first answer", jobs.DeadLetter{Reason: "http_404", LastStatus: 404}, 1},
		{"refused before any request", jobs.DeadLetter{Reason: jobs.ReasonDestinationRefused}, 0},
		{"retries recorded", jobs.DeadLetter{Reason: jobs.ReasonBudgetExhausted, LastStatus: 503, Attempts: make([]jobs.Attempt, 10)}, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (deadletter.Record{Record: tt.d}).Requests(); got != tt.want {
				t.Errorf("Requests() = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestIsMark(t *testing.T) {
	for subj, want := range map[string]bool{
		deadletter.RequeueMarkPrefix + "12": true,
		"mirror.replay.dlq.REQUEUED.3":      true,
		"mirror.dlq.default.a_example_443":  false,
		"mirror.dlq.requeued.a_example_443": false, // a tenant named requeued
	} {
		if got := deadletter.IsMark(subj); got != want {
			t.Errorf("IsMark(%q) = %v, want %v", subj, got, want)
		}
	}
}
