package facts_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
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

// TestSinkLogsTheLimitersReading: a limiter's 503 starts no cooldown, so
// the sink says how the pod read it: the cold blast's refusal as a
// limiter's, and the refusal of the request after the blast's short step
// as the limiter's too, marked after_blast_step (ADR 0030).
func TestSinkLogsTheLimitersReading(t *testing.T) {
	var buf bytes.Buffer
	sink := facts.NewSink(nil, zerolog.New(&buf), nil)
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}},
		StartGuard: -1, Rand: func() float64 { return 0 }, OnEvent: sink.Handle})
	const auth = "files.example.org:443"
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	start := func() pacer.Permit {
		t.Helper()
		if wait, _, _ := p.ReadyIn(at, auth); wait > 0 {
			at = at.Add(wait)
		}
		pm, err := p.Acquire(at, auth, 0)
		if err == nil {
			pm, err = p.Confirm(at, pm)
		}
		if err != nil {
			t.Fatal(err)
		}
		return pm
	}
	for range 6 { // the blast's admissions: a depth of 6
		p.Done(at, start(), pacer.Response{Status: 200, URL: "/ok"})
	}
	start()            // in flight beside the refused one, never answered here
	for i := range 2 { // the blast's refusal, then the request after its short step
		if v := p.Done(at.Add(time.Millisecond), start(), pacer.Response{Status: 503, URL: "/no"}); !v.Throttled {
			t.Fatalf("refusal %d: %+v, want a limiter's", i, v)
		}
	}
	out := buf.String()
	for _, want := range []string{
		`"status":503,"reason":"limiter","interval":333.333333,"after_blast_step":false,"message":"pacer: 503 read as a limiter's refusal (throttling, no cooldown)"`,
		`"status":503,"reason":"limiter","interval":2000,"after_blast_step":true,"message":"pacer: 503 to the request after the cold blast's short step read as the limiter's (throttling, no cooldown)"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
}

// TestSinkRetriesUntilStored: a fact handled while the sink's link to NATS
// is cut, and one handled while it is a black hole (whose attempts time
// out here and all land there when it lifts), are published once the link
// works again, each stored exactly once; meanwhile Pending counts them and
// Flush does not return.
func TestSinkRetriesUntilStored(t *testing.T) {
	for _, fault := range []string{"cut", "black hole"} {
		t.Run(fault, func(t *testing.T) {
			e := brokertest.Start(t, broker.EmbeddedOptions{Listen: "127.0.0.1:0"})
			js, _ := brokertest.JetStream(t, e)
			if err := jobs.EnsureStreams(brokertest.Context(t), js, nil); err != nil {
				t.Fatal(err)
			}
			px, pjs, _ := brokertest.ThroughProxy(t, e, 50*time.Millisecond)
			sink := facts.NewSink(pjs, zerolog.New(zerolog.NewTestWriter(t)), nil)
			sink.SetPod("pod-a")
			ctx, stop := context.WithCancel(brokertest.Context(t))
			done := make(chan error, 1)
			go func() { done <- sink.Run(ctx) }()
			defer func() { stop(); <-done }()

			if fault == "cut" {
				px.Cut()
			} else {
				px.BlackHole()
			}
			const auth = "origin.example:443"
			until := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
			sink.Handle(pacer.Event{Type: pacer.EventCooldown, Authority: auth, At: time.Now(), Until: until, Status: 429})
			sink.Handle(pacer.Event{Type: pacer.EventInterval, Authority: auth, At: time.Now(), Interval: 2 * time.Second})
			if n := sink.Pending(); n != 2 {
				t.Fatalf("Pending %d with the link down, want 2", n)
			}
			// Longer than an attempt's timeout: the first attempt has failed.
			fctx, cancel := context.WithTimeout(ctx, facts.PublishTimeout+500*time.Millisecond)
			err := sink.Flush(fctx)
			cancel()
			if err == nil {
				t.Fatal("Flush returned nil with the link down")
			}
			px.Restore()
			fctx, cancel = context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if err := sink.Flush(fctx); err != nil {
				t.Fatalf("after the link came back: %v", err)
			}
			if n := sink.Pending(); n != 0 {
				t.Errorf("Pending %d after Flush, want 0", n)
			}
			s, err := js.Stream(ctx, jobs.EventsStream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != 2 {
				t.Errorf("MIRROR_EVENTS holds %d facts, want the 2 handled, once each", info.State.Msgs)
			}
			first, err := s.GetMsg(ctx, info.State.FirstSeq)
			if err != nil {
				t.Fatal(err)
			}
			var ev pacer.Event
			if err := json.Unmarshal(first.Data, &ev); err != nil || ev.Type != pacer.EventCooldown || !ev.Until.Equal(until) {
				t.Errorf("first fact stored %s (%v), want the cooldown until %s first", first.Data, err, until)
			}
		})
	}
}
