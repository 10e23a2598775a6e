package departures

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// A worker's fetcher and pacer are this package's Fetcher and Pacer: the
// method sets are equal, so that Wrap takes and returns what a worker is
// built with, and this package need not import the worker.
var (
	_ Fetcher        = worker.Fetcher(nil)
	_ worker.Fetcher = Fetcher(nil)
	_ Pacer          = worker.Pacer(nil)
	_ worker.Pacer   = Pacer(nil)
)

// taken is a Recorder that keeps what it is given.
type taken struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (d *taken) Record(auth string, t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at == nil {
		d.at = map[string][]time.Time{}
	}
	d.at[auth] = append(d.at[auth], t)
}

func (d *taken) of(auth string) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.at[auth]...)
}

// TestLogRoundTrip: what a Log records, ReadFile reads back, in order; a
// line cut short by a kill is skipped; a missing file is no departures; a
// nil Log wraps nothing and closes cleanly.
func TestLogRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pod")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Record("127.0.0.1:8001", t0)
	l.Record("127.0.0.1:8002", t0.Add(time.Millisecond))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("1767225600000000000 127.0.0.1:80") // killed mid-line
	f.Close()
	d := &taken{}
	if n, err := ReadFile(path, d); n != 2 || err != nil {
		t.Fatalf("ReadFile = %d, %v; want 2, nil", n, err)
	}
	if a, b := d.of("127.0.0.1:8001"), d.of("127.0.0.1:8002"); len(a) != 1 || !a[0].Equal(t0) || len(b) != 1 || !b[0].Equal(t0.Add(time.Millisecond)) {
		t.Errorf("read back %v and %v", a, b)
	}
	if n, err := ReadFile(filepath.Join(t.TempDir(), "idle-pod"), d); n != 0 || err != nil {
		t.Errorf("missing log: %d, %v; want 0, nil", n, err)
	}
	var nilLog *Log
	var d0 worker.Deps
	if d0.Fetcher, d0.Pacer = nilLog.Wrap(d0.Fetcher, d0.Pacer); d0.Fetcher != nil || d0.Pacer != nil || nilLog.Close() != nil {
		t.Error("a nil Log must wrap nothing and close cleanly")
	}
	if l, err := Open(""); l != nil || err != nil {
		t.Errorf("Open(\"\") = %v, %v; want nil, nil", l, err)
	}
}

// gateOnly is a worker.Fetcher that only passes its request's gate, after
// a delay: the time a busy slot takes from the pacer's confirm to the
// request.
type gateOnly struct{ delay time.Duration }

func (g *gateOnly) Do(ctx context.Context, r fetch.Request, gate fetch.Gate) (*fetch.Response, error) {
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
	d := &taken{}
	slot := &gateOnly{}
	deps := worker.Deps{Pacer: hp, Fetcher: slot}
	deps.Fetcher, deps.Pacer = Wrap(deps.Fetcher, deps.Pacer, d)
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
		slot.delay = delay
		if _, err := deps.Fetcher.Do(context.Background(), fetch.Request{URL: url}, func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
			gated = append(gated, time.Now())
			return func(r fetch.Result) { deps.Pacer.Done(time.Now(), pm, pacer.Response{Status: r.Status}) }, nil
		}); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	at := d.of(auth)
	if len(at) != 2 {
		t.Fatalf("recorded %d departures, want 2", len(at))
	}
	t.Logf("recorded gap %s; at the gate %s", at[1].Sub(at[0]), gated[1].Sub(gated[0]))
	if g := at[1].Sub(at[0]); g < floor {
		t.Errorf("recorded departures %s apart, below the floor %s", g, floor)
	}
	if g := gated[1].Sub(gated[0]); g >= floor {
		t.Errorf("the gates were %s apart: the slow slot did not make the case this test is for", g)
	}
}

// both keeps the starts with the instant Confirm returned, and the reads.
type both struct {
	taken
	starts [][2]time.Time
	reads  []Read
}

func (b *both) RecordStart(auth string, at, returned time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.starts = append(b.starts, [2]time.Time{at, returned})
}

func (b *both) RecordRead(auth string, r Read) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reads = append(b.reads, r)
}

// TestLogKeepsReadsAndConfirmReturns: a Log's starts with the instant
// Confirm returned and its reads come back from ReadFile and ReadReads as
// written; an old two-field line still reads as a start without it; a
// line cut short is skipped; a missing reads file says so.
func TestLogKeepsReadsAndConfirmReturns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pod")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	l.RecordStart("127.0.0.1:8001", t0, t0.Add(30*time.Microsecond))
	l.Record("127.0.0.1:8001", t0.Add(time.Millisecond))
	r429 := Read{Called: t0.Add(2 * time.Millisecond), Returned: t0.Add(2*time.Millisecond + 40*time.Microsecond), Status: 429, Throttled: true}
	l.RecordRead("127.0.0.1:8001", r429)
	l.RecordRead("127.0.0.1:8001", Read{Called: t0.Add(3 * time.Millisecond), Returned: t0.Add(3 * time.Millisecond), Status: 200})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path+ReadsSuffix, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("1767225600000000000 1767225600000000001 429 1 127.0") // killed mid-line
	f.Close()
	b := &both{}
	if n, err := ReadFile(path, b); n != 2 || err != nil {
		t.Fatalf("ReadFile = %d, %v; want 2, nil", n, err)
	}
	if len(b.starts) != 1 || !b.starts[0][0].Equal(t0) || !b.starts[0][1].Equal(t0.Add(30*time.Microsecond)) {
		t.Errorf("starts with their returns: %v", b.starts)
	}
	if at := b.of("127.0.0.1:8001"); len(at) != 1 || !at[0].Equal(t0.Add(time.Millisecond)) {
		t.Errorf("the start without a return: %v", at)
	}
	n, ok, err := ReadReads(path+ReadsSuffix, b)
	if n != 2 || !ok || err != nil {
		t.Fatalf("ReadReads = %d, %v, %v; want 2, true, nil", n, ok, err)
	}
	if got := b.reads[0]; !got.Called.Equal(r429.Called) || !got.Returned.Equal(r429.Returned) || got.Status != 429 || !got.Throttled || !got.Refusal() {
		t.Errorf("read back %+v, want %+v", got, r429)
	}
	if b.reads[1].Refusal() {
		t.Errorf("a 200 read as a refusal: %+v", b.reads[1])
	}
	if _, ok, err := ReadReads(filepath.Join(t.TempDir(), "old-pod.reads"), b); ok || err != nil {
		t.Errorf("missing reads file: exists %v, %v", ok, err)
	}
}

// TestWrapRecordsTheReads: the recording pacer times each answer the
// worker tells its pacer (Done) with the pacer's verdict, and each start
// with the instant Confirm returned; a request given back unsent is no
// read. A real pacer and a 429 with Retry-After: it is throttled.
func TestWrapRecordsTheReads(t *testing.T) {
	const url = "http://127.0.0.1:9/x"
	a, err := authority.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	auth := a.String()
	hp := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}}})
	b := &both{}
	deps := worker.Deps{Pacer: hp, Fetcher: &gateOnly{}}
	deps.Fetcher, deps.Pacer = Wrap(deps.Fetcher, deps.Pacer, b)
	pm, err := deps.Pacer.Acquire(time.Now(), auth, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if pm, err = pacer.Wait(context.Background(), clock.Real{}, deps.Pacer, pm); err != nil {
		t.Fatal(err)
	}
	if _, err := deps.Fetcher.Do(context.Background(), fetch.Request{URL: url}, func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
		return func(fetch.Result) {
			deps.Pacer.Done(time.Now(), pm, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"2"}}})
		}, nil
	}); err != nil {
		t.Fatal(err)
	}
	pm2, err := hp.Acquire(time.Now().Add(3*time.Second), auth, time.Minute)
	if err == nil {
		deps.Pacer.Done(time.Now(), pm2, pacer.Response{Cancelled: true})
	}
	if len(b.starts) != 1 || b.starts[0][1].Before(b.starts[0][0]) {
		t.Fatalf("starts %v, want one, returned no sooner than given", b.starts)
	}
	if len(b.reads) != 1 {
		t.Fatalf("reads %+v, want the 429 alone", b.reads)
	}
	r := b.reads[0]
	if r.Status != 429 || !r.Throttled || r.Returned.Before(r.Called) || r.Called.Before(b.starts[0][1]) {
		t.Errorf("read %+v after the start %v: want a throttled 429, called after the start returned, returned no sooner than called", r, b.starts[0])
	}
}
