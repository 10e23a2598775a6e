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
