package facts_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/rs/zerolog"
)

// TestSinkLogLines: the pacer logs nothing; the sink writes the lines
// of a capped pause, a cooldown and a recovery from the pacer's events.
func TestSinkLogLines(t *testing.T) {
	var buf bytes.Buffer
	sink := facts.NewSink(nil, zerolog.New(&buf), nil)
	p := pacer.New(&pacer.Options{OnEvent: sink.Handle})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const auth = "files.example.org:443"
	pm, err := p.Acquire(t0, auth, 0)
	if err != nil {
		t.Fatal(err)
	}
	v := p.Done(t0, pm, pacer.Response{Status: 429, Header: map[string][]string{"Retry-After": {"7200"}}})
	pm, err = p.Acquire(v.Until, auth, 0)
	if err != nil || !pm.Probe {
		t.Fatalf("probe after the cooldown: %+v, %v", pm, err)
	}
	p.Done(v.Until, pm, pacer.Response{Status: 200})
	out := buf.String()
	for _, want := range []string{
		`"level":"warn","upstream_host":"files.example.org","upstream_port":"443","asked":7200000,"capped_to":600000`,
		`"message":"pacer: cooldown entered"`,
		`"message":"pacer: cooldown recovered"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, `"upstream_host":"files.example.org","upstream_port":"443"`); n != 3 {
		t.Errorf("%d lines with upstream_host/port, want 3:\n%s", n, out)
	}
}
