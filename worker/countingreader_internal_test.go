package worker

import (
	"bytes"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkCountingReader is the cost of counting a body as it arrives
// (the transfer's bytes and fetched_bytes_total at every read) against
// reading it uncounted: 64 MiB per op in 32 KiB reads, what net/http
// hands the copy into the target.
//
//	go test -run '^$' -bench CountingReader ./worker/
func BenchmarkCountingReader(b *testing.B) {
	src := bytes.Repeat([]byte("x"), 64<<20)
	for _, tc := range []struct {
		name    string
		tr      *transfer
		fetched prometheus.Counter
	}{
		{name: "uncounted"},
		{name: "counted", tr: &transfer{}, fetched: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})},
	} {
		b.Run(tc.name, func(b *testing.B) {
			buf := make([]byte, 32<<10)
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				c := &countingReader{r: io.NopCloser(bytes.NewReader(src)), tr: tc.tr, fetched: tc.fetched}
				for {
					if _, err := c.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}
