package jobs_test

import (
	"testing"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// benchJob is a job as the throughput benchmark publishes it (NewMsg's
// canonical form of an id, a URL and a target).
var benchJob = []byte(`{"v":1,"id":"j4711","url":"http://127.0.0.1:40123/a5/4711","target":"a5/4711","tenant":"default","kind":"artifact"}`)

// BenchmarkParse is the intake's parse of one job: go test -run '^$'
// -bench Parse -benchmem ./jobs/
func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := jobs.Parse(benchJob); err != nil {
			b.Fatal(err)
		}
	}
}
