package worker

import (
	"fmt"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/bytesize"
)

// ShutdownReportEvery is how often a stopping worker says again what it
// still waits for: a stop that waits in silence looks hung (issue 36: 14 s
// of silence after "handing back held jobs").
const ShutdownReportEvery = 5 * time.Second

// describe is the fetches in flight at now, oldest first, as "URL (312.0
// MiB of 500.0 MiB)", and how many there are: the stop's report of what it
// waits for.
func (ts *transfers) describe(now time.Time) (n int, text string) {
	ps := ts.snapshot(now)
	const shown = 5 // a stop with many fetches names the oldest
	parts := make([]string, 0, min(len(ps), shown))
	for _, p := range ps[:min(len(ps), shown)] {
		if p.Expected >= 0 {
			parts = append(parts, fmt.Sprintf("%s (%s of %s)", p.URL, bytesize.Approx(p.Bytes), bytesize.Approx(p.Expected)))
		} else {
			parts = append(parts, fmt.Sprintf("%s (%s so far)", p.URL, bytesize.Approx(p.Bytes)))
		}
	}
	if len(ps) > shown {
		parts = append(parts, fmt.Sprintf("and %d more", len(ps)-shown))
	}
	return len(ps), strings.Join(parts, ", ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
