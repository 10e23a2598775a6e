package facts_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// recorder is an Applier that remembers what it was given.
type recorder struct{ got []pacer.Event }

func (r *recorder) Apply(_ time.Time, ev pacer.Event) { r.got = append(r.got, ev) }

var _ facts.Applier = (*recorder)(nil)

func publishRaw(t *testing.T, js jetstream.JetStream, subject string, data []byte) {
	t.Helper()
	if _, err := js.Publish(brokertest.Context(t), subject, data); err != nil {
		t.Fatal(err)
	}
}

func publishFact(t *testing.T, js jetstream.JetStream, ev pacer.Event) {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	publishRaw(t, js, jobs.EventSubject(authority.KeyOf(ev.Authority)), b)
}

func TestRestoreReplaysFactsInOrderAndSkipsGarbage(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	at := time.Now().Truncate(time.Millisecond)
	const a, b = "a.example:443", "b.example:8080"
	given := []pacer.Event{
		{Type: pacer.EventInterval, Authority: a, At: at, Status: 429, Interval: 2 * time.Second},
		{Type: pacer.EventThrottle, Authority: a, At: at, Status: 429, Interval: 2 * time.Second, Until: at.Add(30 * time.Second), Ceiling: time.Minute},
		{Type: pacer.EventCooldown, Authority: a, At: at, Status: 429, Interval: 2 * time.Second, Until: at.Add(30 * time.Second), Ceiling: time.Minute},
		{Type: pacer.EventCooldown, Authority: b, At: at, Status: 503, Interval: 4 * time.Second, Until: at.Add(10 * time.Second), Ceiling: time.Minute},
		{Type: pacer.EventRecovered, Authority: a, At: at.Add(31 * time.Second), Status: 200, Interval: 2 * time.Second, Ceiling: time.Minute},
	}
	// Garbage between the facts, on pacer subjects: not JSON, an unknown
	// type, a fact without an authority.
	publishFact(t, js, given[0])
	publishRaw(t, js, "mirror.events.pacer.a_example_443", []byte("not json"))
	publishFact(t, js, given[1])
	publishFact(t, js, given[2])
	publishRaw(t, js, "mirror.events.pacer.junk", []byte(`{"type":"party","authority":"junk"}`))
	mid := time.Now() // given[3] and later are stored after mid
	publishFact(t, js, given[3])
	publishRaw(t, js, "mirror.events.pacer.nobody", []byte(`{"type":"cooldown"}`))
	publishFact(t, js, given[4])
	// Not a pacer fact at all, and not on a pacer subject: never read.
	publishRaw(t, js, "mirror.events.other.thing", []byte(`{"type":"cooldown","authority":"c.example:443"}`))

	t.Run("within the window: every fact, in order", func(t *testing.T) {
		var r recorder
		res, err := facts.Restore(ctx, js, &r, facts.RestoreOptions{Logger: zerolog.New(zerolog.NewTestWriter(t))})
		if err != nil {
			t.Fatal(err)
		}
		if !sameEvents(r.got, given) {
			t.Errorf("applied\n%v\nwant\n%v", r.got, given)
		}
		if res.Facts != 5 || res.Authorities != 2 || res.Skipped != 3 {
			t.Errorf("Restore = %+v, want 5 facts, 2 authorities, 3 skipped", res)
		}
	})

	t.Run("beyond the window: the newest fact of each authority", func(t *testing.T) {
		// An hour later every fact is older than the 30 min window. The
		// newest of a is its recovery, which carries the escalated interval
		// that Apply does not read from a recovery: it comes first as an
		// interval fact.
		var r recorder
		clk := clock.NewFake(time.Now().Add(time.Hour))
		res, err := facts.Restore(ctx, js, &r, facts.RestoreOptions{Clock: clk})
		n := res.Facts
		if err != nil {
			t.Fatal(err)
		}
		want := []pacer.Event{
			given[3],
			{Type: pacer.EventInterval, Authority: a, At: given[4].At, Interval: 2 * time.Second, Reason: "restored"},
			given[4],
		}
		if !sameEvents(r.got, want) {
			t.Errorf("applied\n%v\nwant\n%v", r.got, want)
		}
		if n != 2 {
			t.Errorf("Restore = %d facts, want 2", n)
		}
	})

	t.Run("a window starting in the middle", func(t *testing.T) {
		// The window starts at mid: a's facts before it are not read (its
		// newest fact is within), a's recovery restores its interval, and
		// b's cooldown is read within the window.
		var r recorder
		clk := clock.NewFake(mid.Add(facts.DefaultWindow))
		res, err := facts.Restore(ctx, js, &r, facts.RestoreOptions{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		want := []pacer.Event{
			given[3],
			{Type: pacer.EventInterval, Authority: a, At: given[4].At, Interval: 2 * time.Second, Reason: "restored"},
			given[4],
		}
		if !sameEvents(r.got, want) {
			t.Errorf("applied\n%v\nwant\n%v", r.got, want)
		}
		// junk is read as the newest of its subject, nobody within the window.
		if res.Facts != 2 || res.Authorities != 2 || res.Skipped != 2 {
			t.Errorf("Restore = %+v, want 2 facts, 2 authorities, 2 skipped", res)
		}
	})
}

func TestRestoreEmptyAndMissingStream(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	var r recorder
	began := time.Now()
	res, err := facts.Restore(ctx, js, &r, facts.RestoreOptions{})
	n := res.Facts
	if err != nil || n != 0 || len(r.got) != 0 {
		t.Fatalf("Restore on an empty stream = %d, %v (applied %v)", n, err, r.got)
	}
	// Nothing to read must not mean waiting for a message that never comes.
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Restore on an empty stream took %s", took)
	}

	if err := js.DeleteStream(ctx, jobs.EventsStream); err != nil {
		t.Fatal(err)
	}
	if _, err := facts.Restore(ctx, js, &r, facts.RestoreOptions{}); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("Restore without the stream = %v, want ErrStreamNotFound", err)
	}
}

// TestRestoredPacerOwesTheCooldown drives a real pacer: a throttled origin
// teaches the first pacer a cooldown and its facts are published as the
// worker's event sink does; a second, fresh pacer restored from the stream
// refuses the authority until the same deadline, and only then lets a
// single probe through.
func TestRestoredPacerOwesTheCooldown(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	const auth = "origin.example:443"
	now := time.Now()
	var published []pacer.Event
	first := pacer.New(&pacer.Options{OnEvent: func(ev pacer.Event) {
		published = append(published, ev)
		publishFact(t, js, ev)
	}})
	pm, err := first.Acquire(now, auth, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := make(map[string][]string)
	h["Retry-After"] = []string{"30"}
	v := first.Done(now, pm, pacer.Response{Status: 429, Header: h})
	if !v.Throttled || !v.Until.Equal(now.Add(30*time.Second)) {
		t.Fatalf("Done = %+v, want throttled until now+30s", v)
	}
	if len(published) == 0 {
		t.Fatal("the pacer published no fact")
	}

	// A restart 5 s later, on a virtual clock.
	clk := clock.NewFake(now.Add(5 * time.Second))
	second := pacer.New(nil)
	res, err := facts.Restore(ctx, js, second, facts.RestoreOptions{Clock: clk})
	n := res.Facts
	if err != nil || n != len(published) {
		t.Fatalf("Restore = %d, %v; want %d facts", n, err, len(published))
	}
	for _, d := range []time.Duration{5 * time.Second, 29 * time.Second, 30*time.Second - time.Millisecond} {
		_, err := second.Acquire(now.Add(d), auth, 0)
		var re *pacer.RefusedError
		if !errors.As(err, &re) || re.Reason != pacer.ReasonCooling || !re.Until.Equal(v.Until) {
			t.Fatalf("Acquire at +%s = %v; want refused as cooling until %s", d, err, v.Until)
		}
	}
	probe, err := second.Acquire(now.Add(30*time.Second), auth, 0)
	if err != nil || !probe.Probe {
		t.Fatalf("Acquire at the deadline = %+v, %v; want the probe", probe, err)
	}
	if _, err := second.Acquire(now.Add(30*time.Second), auth, 0); err == nil {
		t.Error("a second request was let through while the probe runs")
	}
	// And the interval escalated by the 429 survived the restart.
	st := second.Snapshot(now.Add(30 * time.Second))
	if len(st) != 1 || st[0].Interval != pacer.FirstStep {
		t.Errorf("Snapshot = %+v, want the interval %s", st, pacer.FirstStep)
	}
}

func sameEvents(a, b []pacer.Event) bool {
	return slices.EqualFunc(a, b, func(x, y pacer.Event) bool {
		return x.Type == y.Type && x.Authority == y.Authority && x.At.Equal(y.At) && x.Status == y.Status &&
			x.Reason == y.Reason && x.Interval == y.Interval && x.Until.Equal(y.Until) && x.Ceiling == y.Ceiling
	})
}

// TestRestoreKeepsAnOperatorsPause: a restarted worker owes an operator's
// pause as it owes a cooldown (mirrorworker pause, then a restart: issue
// 26), within the window and beyond it, even when pacer facts of the
// authority follow the pause; and a resume is restored too.
func TestRestoreKeepsAnOperatorsPause(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	const auth = "paused.example:443"
	now := time.Now()
	pause := pacer.Event{Type: pacer.EventPaused, Authority: auth, At: now, Until: now.Add(3 * time.Hour), Reason: "maintenance"}
	if err := facts.PublishOperator(ctx, js, pause); err != nil {
		t.Fatal(err)
	}
	// A pod's facts after the pause (a decay step, a late response's
	// cooldown): the newest pacer fact of the authority is not the pause.
	publishFact(t, js, pacer.Event{Type: pacer.EventInterval, Authority: auth, At: now, Interval: 2 * time.Second})
	publishFact(t, js, pacer.Event{Type: pacer.EventCooldown, Authority: auth, At: now, Status: 429, Until: now.Add(time.Second)})

	refusedPaused := func(t *testing.T, p *pacer.Pacer, at time.Time) {
		t.Helper()
		_, err := p.Acquire(at, auth, 0)
		var re *pacer.RefusedError
		if !errors.As(err, &re) || re.Reason != pacer.ReasonPaused || !re.Until.Equal(pause.Until) {
			t.Fatalf("Acquire at %s after the restore = %v; want refused as paused until %s", at, err, pause.Until)
		}
	}
	restore := func(t *testing.T, at time.Time) (*pacer.Pacer, facts.RestoreResult) {
		t.Helper()
		p := pacer.New(nil)
		res, err := facts.Restore(ctx, js, p, facts.RestoreOptions{Clock: clock.NewFake(at), Logger: zerolog.New(zerolog.NewTestWriter(t))})
		if err != nil {
			t.Fatal(err)
		}
		if res.Skipped != 0 {
			t.Errorf("Restore skipped %d messages, want 0 (a pause is a fact)", res.Skipped)
		}
		return p, res
	}
	t.Run("within the window", func(t *testing.T) {
		at := now.Add(time.Minute)
		p, res := restore(t, at)
		if res.Facts != 3 {
			t.Errorf("Restore applied %d facts, want 3", res.Facts)
		}
		refusedPaused(t, p, at)
	})
	t.Run("beyond the window, pacer facts after it", func(t *testing.T) {
		at := now.Add(2 * time.Hour) // every fact is older than the window; the pause is not over
		p, _ := restore(t, at)
		refusedPaused(t, p, at)
		if _, err := p.Acquire(pause.Until, auth, 0); err != nil {
			t.Errorf("Acquire when the pause ends = %v, want granted", err)
		}
	})

	resumedAt := time.Now()
	if err := facts.PublishOperator(ctx, js, pacer.Event{Type: pacer.EventResumed, Authority: auth, At: resumedAt}); err != nil {
		t.Fatal(err)
	}
	for name, at := range map[string]time.Time{"resumed, within the window": resumedAt.Add(time.Minute), "resumed, beyond the window": resumedAt.Add(2 * time.Hour)} {
		t.Run(name, func(t *testing.T) {
			p, _ := restore(t, at)
			if _, err := p.Acquire(at, auth, 0); err != nil {
				t.Errorf("Acquire after restoring the resume = %v, want granted", err)
			}
		})
	}
}
