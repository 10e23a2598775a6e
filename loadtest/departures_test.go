package loadtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestDepartureLogsMergeAcrossPods: two pods each keep a polite 100 ms
// spacing to one authority in their own log, but interleaved they sent
// pairs 30 ms apart; merged, the load test counts every such pair. A line
// cut short by a kill is skipped, and a pod that sent nothing has no file.
func TestDepartureLogsMergeAcrossPods(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pods := []struct {
		path   string
		offset time.Duration
	}{
		{filepath.Join(dir, "pod1"), 0},
		{filepath.Join(dir, "pod2"), 30 * time.Millisecond},
	}
	for _, p := range pods {
		l, err := OpenDepartureLog(p.path)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			l.record("127.0.0.1:8001", t0.Add(p.offset+time.Duration(i)*100*time.Millisecond))
		}
		l.record("127.0.0.1:8002", t0.Add(p.offset)) // one each: 30 ms apart
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(pods[1].path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("1767225600000000000 127.0.0.1:80") // killed mid-line
	f.Close()

	d := newDepartures()
	for _, p := range pods {
		n, err := d.readDepartureLog(p.path)
		if err != nil || n != 6 {
			t.Fatalf("%s: %d departures, err %v; want 6", p.path, n, err)
		}
	}
	if n, err := d.readDepartureLog(filepath.Join(dir, "idle-pod")); n != 0 || err != nil {
		t.Fatalf("missing log: %d, %v; want 0, nil", n, err)
	}
	// 8001: 0, 30, 100, 130, ... 430: 9 gaps, 5 of 30 ms and 4 of 70 ms;
	// 8002: one gap of 30 ms.
	below, minGap := d.belowFloor(100 * time.Millisecond)
	if below != 10 || minGap != 30*time.Millisecond {
		t.Errorf("belowFloor = %d, %v; want 10, 30ms", below, minGap)
	}
	if below, _ := d.belowFloor(50 * time.Millisecond); below != 6 {
		t.Errorf("below 50ms: %d, want 6", below)
	}
	var nilLog *DepartureLog
	var d0 worker.Deps
	if nilLog.Wrap(&d0); d0.Fetcher != nil || d0.Pacer != nil || nilLog.Close() != nil {
		t.Error("a nil DepartureLog must wrap nothing and close cleanly")
	}
	if l, err := OpenDepartureLog(""); l != nil || err != nil {
		t.Errorf("OpenDepartureLog(\"\") = %v, %v; want nil, nil", l, err)
	}
}

// gateOnly is a worker.Fetcher that only passes its request's gate, after
// a delay: the time a busy slot takes from the pacer's confirm to the
// request.
type gateOnly struct{ delay time.Duration }

func (g gateOnly) Do(ctx context.Context, r fetch.Request, gate fetch.Gate) (*fetch.Response, error) {
	time.Sleep(g.delay)
	a, err := authority.Parse(r.URL)
	if err != nil {
		return nil, err
	}
	done, err := gate(ctx, 0, a)
	if err != nil {
		return nil, err
	}
	done(fetch.Result{Status: 200})
	return &fetch.Response{Status: 200}, nil
}

// TestDeparturesAreTheConfirmedStarts: a worker's departures are recorded
// at the instants its pacer confirmed the starts, not when the request got
// past its gate. The first request is slow from the confirm to the gate
// (60 ms, a loaded machine), the second is not: timed at the gate they
// would be about floor+guard-60 ms apart, below the 100 ms floor, though
// the pacer spaced them correctly; recorded as confirmed they are not. The
// recording pacer keeps the pause method the worker looks for.
func TestDeparturesAreTheConfirmedStarts(t *testing.T) {
	const floor = 100 * time.Millisecond
	const url = "http://127.0.0.1:9/x"
	a, err := authority.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	auth := a.String()
	hp := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: 2}}})
	d := newDepartures()
	deps := worker.Deps{Pacer: hp}
	d.wrap(&deps)
	if _, ok := deps.Pacer.(interface {
		Apply(time.Time, pacer.Event)
	}); !ok {
		t.Fatal("the recording pacer hides the pacer's Apply (an operator's pause)")
	}
	var gated []time.Time
	for i, delay := range []time.Duration{60 * time.Millisecond, 0} {
		pm, err := deps.Pacer.Acquire(time.Now(), auth, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if pm, err = pacer.Wait(context.Background(), clock.Real{}, deps.Pacer, pm); err != nil {
			t.Fatal(err)
		}
		deps.Fetcher = recordingFetcher{f: gateOnly{delay: delay}, r: deps.Fetcher.(recordingFetcher).r}
		if _, err := deps.Fetcher.Do(context.Background(), fetch.Request{URL: url}, func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
			gated = append(gated, time.Now())
			return func(r fetch.Result) { deps.Pacer.Done(time.Now(), pm, pacer.Response{Status: r.Status}) }, nil
		}); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	below, minGap := d.belowFloor(floor)
	t.Logf("recorded gap %s; at the gate %s", minGap, gated[1].Sub(gated[0]))
	if below != 0 || len(d.at[auth]) != 2 {
		t.Errorf("recorded %d departures with %d below the floor (closest %s), want 2 and none", len(d.at[auth]), below, minGap)
	}
	if g := gated[1].Sub(gated[0]); g >= floor {
		t.Errorf("the gates were %s apart: the slow slot did not make the case this test is for", g)
	}
}
