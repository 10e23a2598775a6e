package loadtest

import (
	"context"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
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
			told, crossed, _, list := l.split(tt.starts, nil, t0)
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
	gotTold, gotCrossed, _, list := l.split(map[int][]time.Time{0: starts}, nil, starts[0])
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
	if told, crossed, _, _ := l.split(nil, nil, starts[0]); told != 2 || crossed != 0 {
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

// TestClassifyToldStart: a start granted (its Confirm returned) before its
// client began telling its pacer of a refusal read after the origin wrote
// the one that told was granted unread; at or after that instant, or with
// an instant unknown, it counts as read. Reads of answers that are no
// refusal, and readings begun before the refusal was written (another
// answer), do not count. Real timestamps, one clock.
func TestClassifyToldStart(t *testing.T) {
	written := time.Now()
	at := func(us int) time.Time { return written.Add(time.Duration(us) * time.Microsecond) }
	refusal := func(called int) departlog.Read {
		return departlog.Read{Called: at(called), Returned: at(called + 20), Status: 429, Throttled: true}
	}
	tests := []struct {
		name      string
		confirmed time.Time
		written   time.Time
		reads     []departlog.Read
		want      string
		margin    time.Duration
		ok        bool
	}{
		{name: "granted 750 us before its client read the refusal", confirmed: at(750), written: written, reads: []departlog.Read{refusal(1500)}, want: ToldUnread, margin: -750 * time.Microsecond, ok: true},
		{name: "granted 1 ns before", confirmed: at(1500).Add(-1), written: written, reads: []departlog.Read{refusal(1500)}, want: ToldUnread, margin: -1, ok: true},
		{name: "granted as the pacer was being told", confirmed: at(1510), written: written, reads: []departlog.Read{refusal(1500)}, want: ToldRead, margin: 10 * time.Microsecond, ok: true},
		{name: "granted after its client read it", confirmed: at(2500), written: written, reads: []departlog.Read{refusal(1500)}, want: ToldRead, margin: time.Millisecond, ok: true},
		{name: "the first refusal read counts", confirmed: at(2500), written: written, reads: []departlog.Read{refusal(3000), refusal(2000)}, want: ToldRead, margin: 500 * time.Microsecond, ok: true},
		{name: "a 503 without the pacer's verdict is a refusal", confirmed: at(2500), written: written, reads: []departlog.Read{{Called: at(2000), Returned: at(2010), Status: 503}}, want: ToldRead, margin: 500 * time.Microsecond, ok: true},
		{name: "a 200 read is no refusal", confirmed: at(2500), written: written, reads: []departlog.Read{{Called: at(2000), Returned: at(2010), Status: 200}}, want: ToldUnread},
		{name: "a refusal read before this one was written is another", confirmed: at(2500), written: written, reads: []departlog.Read{refusal(-100)}, want: ToldUnread},
		{name: "no refusal read at all", confirmed: at(2500), written: written, want: ToldUnread},
		{name: "grant unknown", written: written, reads: []departlog.Read{refusal(1500)}, want: ToldRead},
		{name: "refusal's write unknown", confirmed: at(750), reads: []departlog.Read{refusal(1500)}, want: ToldRead},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, margin, ok := ClassifyToldStart(tt.confirmed, tt.written, tt.reads)
			if got != tt.want || ok != tt.ok || (ok && margin != tt.margin) {
				t.Errorf("ClassifyToldStart = %q, %v, %v; want %q, %v, %v", got, margin, ok, tt.want, tt.margin, tt.ok)
			}
		})
	}
}

// TestSplitFromTheClientSide: a told request counts as granted before its
// pod read a refusal only when every start its pod logs could make it was
// granted before that pod began reading one, the pods log their reads,
// and a start is logged at all. The logs go through real departure-log
// files, as the pods write them.
func TestSplitFromTheClientSide(t *testing.T) {
	t0 := time.Now()
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	const auth = "127.0.0.1:8001"
	// The origin refused x (arrived at 0), began writing its 429 at
	// 1000 us, telling until 2 s; e arrived at 3250 us, early.
	l := newRefusalLog()
	l.arrival(stuborigin.Arrival{Identity: "i", Arrived: at(0), Handled: at(0), Outcome: stuborigin.RateLimited})
	l.toldHook(stuborigin.Told{Identity: "i", Decided: at(0), Written: at(1000), Until: at(2_000_000)})
	l.arrival(stuborigin.Arrival{Identity: "i", Arrived: at(3250), Handled: at(3300), Outcome: stuborigin.RateLimited, Early: true})
	type start struct{ at, returned int }
	type pod struct {
		starts    []start
		reads     []int // Called of each 429 read
		noReads   bool  // an old pod: no reads file
		noReturns bool  // starts logged without the Confirm's return
	}
	tests := []struct {
		name    string
		pods    map[string]pod
		unread  bool
		readMs  float64 // the reported margin, when there is one
		hasRead bool
	}{
		{name: "granted 0.75 ms after the write, its pod read it 1.4 ms later",
			pods:   map[string]pod{"pod1": {starts: []start{{-5000, -4990}, {1750, 1760}}, reads: []int{3160}}},
			unread: true, readMs: -1.4, hasRead: true},
		{name: "granted after its pod began reading the 429",
			pods:   map[string]pod{"pod1": {starts: []start{{-5000, -4990}, {3100, 3110}}, reads: []int{3000}}},
			unread: false, readMs: 0.11, hasRead: true},
		{name: "granted by one pod before it read, but another pod's start after its own read could be the request",
			pods: map[string]pod{
				"pod1": {starts: []start{{1750, 1760}}, reads: []int{3160}},
				"pod2": {starts: []start{{3000, 3010}}, reads: []int{2000}},
			},
			unread: false, readMs: 1.01, hasRead: true},
		{name: "no refusal read by then",
			pods:   map[string]pod{"pod1": {starts: []start{{1750, 1760}}}},
			unread: true},
		{name: "an old pod logs no reads",
			pods:   map[string]pod{"pod1": {starts: []start{{1750, 1760}}, noReads: true}},
			unread: false},
		{name: "an old pod logs no Confirm returns",
			pods:   map[string]pod{"pod1": {starts: []start{{1750, 1760}}, reads: []int{3160}, noReturns: true}},
			unread: false},
		{name: "no start logged before the arrival",
			pods:   map[string]pod{"pod1": {starts: []start{{4000, 4010}}, reads: []int{3160}}},
			unread: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			d := newDepartures()
			for name, p := range tt.pods {
				path := filepath.Join(dir, name)
				lg, err := departlog.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range p.starts {
					if p.noReturns {
						lg.Record(auth, at(s.at))
					} else {
						lg.RecordStart(auth, at(s.at), at(s.returned))
					}
				}
				for _, c := range p.reads {
					lg.RecordRead(auth, departlog.Read{Called: at(c), Returned: at(c + 30), Status: 429, Throttled: true})
				}
				lg.Close()
				if p.noReads {
					os.Remove(path + departlog.ReadsSuffix)
				}
				if _, err := d.readDepartureLog(name, path); err != nil {
					t.Fatal(err)
				}
			}
			auths := []string{auth}
			told, crossed, unread, list := l.split(d.byIndex(auths), d.byClient(auths), t0)
			if told != 1 || crossed != 0 || len(list) != 1 {
				t.Fatalf("told %d, crossed %d, %d listed; want the one told", told, crossed, len(list))
			}
			e := list[0]
			want, wantSide := int64(0), ToldRead
			if tt.unread {
				want, wantSide = 1, ToldUnread
			}
			if unread != want || e.ClientSide != wantSide {
				t.Errorf("unread %d, client side %q; want %d, %q (%+v)", unread, e.ClientSide, want, wantSide, e)
			}
			if (e.ClientReadMs != nil) != tt.hasRead || (tt.hasRead && math.Abs(*e.ClientReadMs-tt.readMs) > 1e-6) {
				t.Errorf("client read margin %v, want %v (%v)", e.ClientReadMs, tt.readMs, tt.hasRead)
			}
			res := Result{Early: 1, EarlyTold: told, EarlyCrossed: crossed, EarlyToldUnread: unread}
			if res.Told() != 1 || res.ToldAfterRead() != 1-want {
				t.Errorf("Told %d, ToldAfterRead %d", res.Told(), res.ToldAfterRead())
			}
		})
	}
}
