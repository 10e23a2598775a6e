package jobs_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// FuzzParse checks that Parse never panics, that every error is an
// *InvalidError, and that an accepted job is consistent: its canonical form
// parses back to itself, its target is valid and its subject checks.
// Seeds are in testdata/fuzz/FuzzParse; run with
// go test -run '^$' -fuzz FuzzParse ./jobs/
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"url":"https://files.example.org/a/b.tar.gz"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := jobs.Parse(data)
		if err != nil {
			var ie *jobs.InvalidError
			if !errors.As(err, &ie) || ie.Code == "" || ie.Msg == "" {
				t.Fatalf("error %T %v is not a complete *InvalidError", err, err)
			}
			return
		}
		b, err := j.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		again, err := jobs.Parse(b)
		if err != nil {
			t.Fatalf("canonical form %s of an accepted job is rejected: %v", b, err)
		}
		if !reflect.DeepEqual(again, j) {
			t.Fatalf("canonical round trip changed the job:\n %+v\n %+v", j, again)
		}
		if err := jobs.CheckTarget(j.Target); err != nil {
			t.Fatalf("accepted target %q: %v", j.Target, err)
		}
		if err := jobs.CheckSubject(j, j.Subject()); err != nil {
			t.Fatalf("subject %q of an accepted job: %v", j.Subject(), err)
		}
	})
}
