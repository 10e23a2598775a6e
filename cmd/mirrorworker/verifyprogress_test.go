package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestVerifyProgressLines: off a terminal, a line every interval of
// (virtual) time with objects and bytes of the totals, the rate and the
// time left; none between; a summary at the end.
func TestVerifyProgressLines(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0
	var out bytes.Buffer
	p := newVerifyProgress(&out, 5*time.Second, func() time.Time { return now })
	p.begin(4, 400<<20)
	for i := range 4 {
		for range 100 {
			now = now.Add(25 * time.Millisecond)
			p.read(1 << 20) // 1 MiB per 25 ms: 40 MiB/s
		}
		p.object()
		if i == 0 && out.Len() != 0 {
			t.Errorf("a line before 5 s: %q", out.String())
		}
	}
	p.done()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		"verify: 1 of 4 objects, 200.0 MiB of 400.0 MiB (50%), 40.0 MiB/s, 5s left",
		"verify: 3 of 4 objects, 400.0 MiB of 400.0 MiB (100%), 40.0 MiB/s",
		"verify: checked 4 objects, 400.0 MiB in 10s",
	}
	if len(lines) != len(want) {
		t.Fatalf("lines:\n%s\nwant:\n%s", out.String(), strings.Join(want, "\n"))
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d: %q, want %q", i, lines[i], want[i])
		}
	}
	if newVerifyProgress(&out, 0, time.Now) != nil {
		t.Error("--progress-every 0 shows progress")
	}
}
