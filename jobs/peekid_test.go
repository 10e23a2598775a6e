package jobs_test

import (
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// Issue 13, case 6: an invalid job's id survives its error, so that its
// dead letter names it; an id that breaks the id rule does not.
func TestParseErrorKeepsTheID(t *testing.T) {
	tests := []struct {
		name, data, wantID string
	}{
		{"bad url", `{"id":"job-1","url":"ftp://example.org/x"}`, "job-1"},
		{"bad header", `{"id":"a.b:c_d-1","url":"https://example.org/x","headers":{"Cookie":"x"}}`, "a.b:c_d-1"},
		{"newer version", `{"v":9,"id":"v9","url":"https://example.org/x"}`, "v9"},
		{"no url", `{"id":"lonely"}`, "lonely"},
		{"invalid id", `{"id":"no spaces allowed","url":"ftp://x"}`, ""},
		{"id of another type", `{"id":42,"url":"ftp://x"}`, ""},
		{"an overlong id", `{"id":"` + strings.Repeat("x", jobs.MaxIDLen+1) + `"}`, ""},
		{"not json", "\xff{", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j, err := jobs.Parse([]byte(tc.data))
			if err == nil {
				t.Fatal("Parse accepted an invalid job")
			}
			if j.ID != tc.wantID || j.URL != "" || j.Target != "" {
				t.Errorf("Parse error returned %+v, want only id %q", j, tc.wantID)
			}
		})
	}
}
