package loadtest

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// TestClassifyEarly: a request known to have left before the origin wrote
// the refusal crossed it; one that left after, at the same instant, or at
// an unknown instant, was told to wait. Real timestamps, one clock.
func TestClassifyEarly(t *testing.T) {
	written := time.Now()
	tests := []struct {
		name          string
		left, written time.Time
		want          string
	}{
		{name: "left 1 ms before the refusal was written", left: written.Add(-time.Millisecond), written: written, want: EarlyCrossed},
		{name: "left 1 ns before", left: written.Add(-1), written: written, want: EarlyCrossed},
		{name: "left at the same instant", left: written, written: written, want: EarlyTold},
		{name: "left 1 ms after", left: written.Add(time.Millisecond), written: written, want: EarlyTold},
		{name: "departure unknown", written: written, want: EarlyTold},
		{name: "refusal unknown", left: written.Add(-time.Millisecond), want: EarlyTold},
		{name: "a wall-clock reading against a monotonic one", left: time.Unix(0, written.UnixNano()-1000), written: written, want: EarlyCrossed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClassifyEarly(tt.left, tt.written); got != tt.want {
				t.Errorf("ClassifyEarly = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestSplitNeedsDepartures: the split takes a request's arrival as the
// latest instant it left, and only where the clients' departure logs agree;
// without logs, or with logs that show fewer starts before the refusal
// than arrivals, every early request is told (the origin's count).
func TestSplitNeedsDepartures(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := newRefusalLog()
	// a refused at 10 ms, its answer written at 12 ms, telling until 2 s;
	// b arrived at 11 ms (on its way), c at 20 ms (after the answer).
	l.arrival(stuborigin.Arrival{Identity: "i", Arrived: at(10), Handled: at(10), Outcome: stuborigin.RateLimited})
	l.toldHook(stuborigin.Told{Identity: "i", Decided: at(10), Written: at(12), Until: at(2000)})
	l.arrival(stuborigin.Arrival{Identity: "i", Arrived: at(11), Handled: at(13), Outcome: stuborigin.RateLimited, Early: true})
	l.arrival(stuborigin.Arrival{Identity: "i", Arrived: at(20), Handled: at(20), Outcome: stuborigin.RateLimited, Early: true})
	tests := []struct {
		name          string
		starts        map[int][]time.Time
		told, crossed int64
	}{
		{name: "logs agree", starts: map[int][]time.Time{0: {at(9), at(10), at(15)}}, told: 1, crossed: 1},
		{name: "no departure logs", starts: nil, told: 2},
		{name: "a log short of the arrivals", starts: map[int][]time.Time{0: {at(9), at(15)}}, told: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			told, crossed, list := l.split(tt.starts, t0)
			if told != tt.told || crossed != tt.crossed || len(list) != 2 {
				t.Fatalf("told %d crossed %d (%d listed), want %d and %d", told, crossed, len(list), tt.told, tt.crossed)
			}
			if list[1].Class != EarlyTold || list[1].MarginMs != 8 {
				t.Errorf("the request after the answer: %+v, want told, 8 ms after it", list[1])
			}
		})
	}
}

// TestEarlySplitAgainstTheStubOrigin runs the real stub origin (a leaky
// bucket refusing with 429 and Retry-After: 2, and a tarpit that holds
// each answer 1 s once a 429 was given) on loopback. A request sent after
// a refusal reached the client counts as told; of two in flight at once
// and both refused, the second, which left while the first's refusal was
// held and unwritten, counts as crossed.
func TestEarlySplitAgainstTheStubOrigin(t *testing.T) {
	const hold = time.Second
	p := &stuborigin.Profile{
		Name:     "nginx-tarpit",
		LimitReq: &stuborigin.LimitReq{Rate: 0.25, NoDelay: true, Status: 429, RetryAfter: stuborigin.Duration{Duration: 2 * time.Second}},
		Penalty: &stuborigin.Penalty{Count: stuborigin.Count429, After: 1,
			Within: stuborigin.Duration{Duration: time.Minute}, For: stuborigin.Duration{Duration: time.Minute},
			Tarpit: stuborigin.Duration{Duration: hold}},
	}
	l := newRefusalLog()
	arrived := make(chan stuborigin.Arrival, 16)
	told := make(chan stuborigin.Told, 16)
	og, err := stuborigin.New(p, &stuborigin.Options{
		OnArrival: func(a stuborigin.Arrival) { l.arrival(a); arrived <- a },
		OnTold:    func(tl stuborigin.Told) { l.toldHook(tl); told <- tl },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	urls, err := og.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer og.Close()

	// The client's departure log: each request's start, before it is
	// written (as a pacer's confirm).
	var starts []time.Time
	// Each request on a connection of its own, so that two can be in
	// flight at once.
	send := func(name string) <-chan int {
		starts = append(starts, time.Now())
		done := make(chan int, 1)
		go func() {
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := c.Get(urls[0] + "/objects/" + name + "?size=1")
			if err != nil {
				t.Errorf("%s: %v", name, err)
				done <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done
	}
	status := func(name string, ch <-chan int, want int) {
		t.Helper()
		if got := <-ch; got != want {
			t.Fatalf("%s: status %d, want %d", name, got, want)
		}
	}
	status("first", send("first"), http.StatusOK)
	<-arrived
	status("x", send("x"), http.StatusTooManyRequests) // starts the tarpit for what follows
	<-arrived
	x := <-told
	// Wait out x's Retry-After, so that a's refusal is the first to tell.
	for time.Now().Before(x.Until.Add(10 * time.Millisecond)) {
		time.Sleep(time.Until(x.Until.Add(10 * time.Millisecond)))
	}
	aDone := send("a")
	a := <-arrived // a is decided: its refusal is held, unwritten
	if a.Early || a.Outcome != stuborigin.RateLimited {
		t.Fatalf("a: %+v, want a refusal on time", a)
	}
	bDone := send("b") // on its way while a's refusal is held
	b := <-arrived
	status("a", aDone, http.StatusTooManyRequests) // a's refusal reached the client
	aTold := <-told
	cDone := send("c") // sent after that
	c := <-arrived
	status("b", bDone, http.StatusTooManyRequests)
	status("c", cDone, http.StatusTooManyRequests)

	if !b.Early || !c.Early {
		t.Fatalf("early: b %v, c %v; want both (a told until %v; b handled %v, c %v)", b.Early, c.Early, aTold.Until, b.Handled, c.Handled)
	}
	// The facts the classification must follow, on the one clock.
	if !b.Arrived.Before(aTold.Written) {
		t.Fatalf("b arrived %v after a's refusal was written (%v): the write was timed before the hold, or the machine stalled for the whole %v of it", b.Arrived, aTold.Written, hold)
	}
	if !c.Arrived.After(aTold.Written) {
		t.Fatalf("c arrived %v, before a's refusal was written (%v)", c.Arrived, aTold.Written)
	}
	gotTold, gotCrossed, list := l.split(map[int][]time.Time{0: starts}, starts[0])
	if gotTold != 1 || gotCrossed != 1 {
		t.Fatalf("told %d, crossed %d; want 1 and 1: %+v", gotTold, gotCrossed, list)
	}
	if list[0].Class != EarlyCrossed || list[1].Class != EarlyTold {
		t.Errorf("classes %s then %s, want b crossed then c told", list[0].Class, list[1].Class)
	}
	if st := og.Stats().Sum(); st.Early != 2 {
		t.Errorf("the origin counts %d early, want 2: the split is of its count", st.Early)
	}
	// Without the client's departures nothing is known: the origin's count.
	if told, crossed, _ := l.split(nil, starts[0]); told != 2 || crossed != 0 {
		t.Errorf("without departures: told %d, crossed %d; want 2 and 0", told, crossed)
	}
}

// TestVerdictCountsOnlyTheTold: a request proved to have crossed a refusal
// is not rude; every other early request is, as before the split.
func TestVerdictCountsOnlyTheTold(t *testing.T) {
	tests := []struct {
		name           string
		early, crossed int64
		rude           bool
		verdict        string
	}{
		{name: "one early, proved crossed", early: 1, crossed: 1, rude: false,
			verdict: "Finished first without being rude: w, drained in 10.0 s (2 429s, 0 told to wait, 1 crossed a refusal in flight, 0 bans)."},
		{name: "one early, not proved crossed", early: 1, rude: true,
			verdict: "No strategy drained without being rude."},
		{name: "two early, one proved crossed", early: 2, crossed: 1, rude: true,
			verdict: "No strategy drained without being rude."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Result{Strategy: "w", Drained: true, DrainSeconds: 10, Status429: 2, Early: tt.early, EarlyCrossed: tt.crossed}
			if res.Rude() != tt.rude {
				t.Errorf("Rude() = %v, want %v", res.Rude(), tt.rude)
			}
			r := &Report{Results: []Result{res}}
			if v := r.Verdict(); v[0] != tt.verdict {
				t.Errorf("verdict %q, want %q", v[0], tt.verdict)
			}
		})
	}
}
