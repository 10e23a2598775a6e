package pacer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// op is one step of a budget scenario, on the virtual instant t0+at.
type op struct {
	at   time.Duration
	kind string // "acquire" (maxWait wait), "confirm" or "done"
	id   string // the permit's name in the scenario
	wait time.Duration
	// done: the response.
	status int
	h      []string
	// acquire and confirm: the refusal expected ("" for a grant) and, for
	// a grant, its Start (from t0) and the Interval it reports; -1: any.
	want      pacer.Reason
	wantStart time.Duration
	wantIv    time.Duration
}

func acquire(at time.Duration, id string, want pacer.Reason, start time.Duration) op {
	return op{at: at, kind: "acquire", id: id, want: want, wantStart: start, wantIv: -1}
}

func done(at time.Duration, id string, h ...string) op {
	return op{at: at, kind: "done", id: id, status: 200, h: h}
}

// The pure decision rules of an announced budget, on fixed instants.
func TestAnnouncedBudget(t *testing.T) {
	const ms = time.Millisecond
	ietf := func(item, policy string) []string {
		h := []string{"RateLimit", item}
		if policy != "" {
			h = append(h, "RateLimit-Policy", policy)
		}
		return h
	}
	tests := []struct {
		name  string
		floor time.Duration
		cap   int
		ops   []op
	}{
		{"a request already sent is spent from what remains", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			acquire(100*ms, "b", "", 100*ms),
			// a's answer: one left, but b was sent after a and takes it.
			done(150*ms, "a", ietf(`"q";r=1;t=10`, "")...),
			acquire(200*ms, "c", pacer.ReasonInFlight, -1),
			// b's answer is the fresh reading: one left, nothing out.
			done(250*ms, "b", ietf(`"q";r=1;t=10`, "")...),
			acquire(250*ms, "c", "", 250*ms),
		}},
		{"the same through X-RateLimit-Remaining", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			acquire(100*ms, "b", "", 100*ms),
			done(150*ms, "a", "X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "30"),
			acquire(200*ms, "c", pacer.ReasonInFlight, -1),
			done(250*ms, "b", "X-RateLimit-Remaining", "2", "X-RateLimit-Reset", "30"),
			acquire(250*ms, "c", "", 250*ms),
		}},
		{"with more left than out, the floor alone spaces", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			acquire(100*ms, "b", "", 100*ms),
			done(150*ms, "a", ietf(`"q";r=2;t=10`, `"q";q=20;w=10`)...),
			// b out takes one, one is left for c: c takes the last one, so
			// it is paced at the policy's 500 ms from b.
			acquire(200*ms, "c", pacer.ReasonSpacing, -1),
			acquire(600*ms, "c", "", 600*ms),
		}},
		{"an earlier request's reading that leaves less wins", 100 * ms, 3, []op{
			acquire(0, "a", "", 0),
			acquire(100*ms, "b", "", 100*ms),
			done(150*ms, "b", ietf(`"q";r=3;t=10`, "")...),
			done(160*ms, "a", ietf(`"q";r=1;t=10`, "")...), // admitted after b
			acquire(200*ms, "c", "", 200*ms),
			acquire(300*ms, "d", pacer.ReasonInFlight, -1),
		}},
		{"an earlier request's reading that leaves more is ignored", 100 * ms, 3, []op{
			acquire(0, "a", "", 0),
			acquire(100*ms, "b", "", 100*ms),
			done(150*ms, "b", ietf(`"q";r=1;t=10`, "")...),
			done(160*ms, "a", ietf(`"q";r=4;t=10`, "")...),
			acquire(200*ms, "c", "", 200*ms),
			acquire(300*ms, "d", pacer.ReasonInFlight, -1),
		}},
		{"down to the last request: paced at RateLimit-Policy q/w", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			done(10*ms, "a", ietf(`"sustained";r=1;t=10`, `"burst";q=5;w=2, "sustained";q=20;w=10`)...),
			{at: 100 * ms, kind: "acquire", id: "b", want: pacer.ReasonSpacing},
			{at: 500 * ms, kind: "acquire", id: "b", wantStart: 500 * ms, wantIv: 500 * ms},
		}},
		{"the named policy's pace, not another's", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			done(10*ms, "a", ietf(`"burst";r=1;t=2`, `"burst";q=5;w=2, "sustained";q=20;w=10`)...),
			acquire(100*ms, "b", pacer.ReasonSpacing, -1),
			acquire(400*ms, "b", "", 400*ms),
		}},
		{"surplus is spent at the floor", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			done(10*ms, "a", ietf(`"sustained";r=5;t=10`, `"sustained";q=20;w=10`)...),
			{at: 100 * ms, kind: "acquire", id: "b", wantStart: 100 * ms, wantIv: 100 * ms},
		}},
		{"paced at a windowed X-RateLimit-Limit", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			done(10*ms, "a", "X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "60", "X-RateLimit-Limit", "60, 60;w=60"),
			acquire(100*ms, "b", pacer.ReasonSpacing, -1),
			acquire(time.Second, "b", "", time.Second),
		}},
		{"a Limit without a window gives no pace", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			done(10*ms, "a", "X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "60", "X-RateLimit-Limit", "60"),
			acquire(100*ms, "b", "", 100*ms),
		}},
		{"never faster than the floor", 2 * time.Second, 2, []op{
			acquire(0, "a", "", 0),
			done(10*ms, "a", ietf(`"s";r=1;t=10`, `"s";q=10;w=1`)...),
			{at: time.Second, kind: "acquire", id: "b", want: pacer.ReasonSpacing},
			{at: 2 * time.Second, kind: "acquire", id: "b", wantStart: 2 * time.Second, wantIv: 2 * time.Second},
		}},
		{"a reading lapses at its reset", 100 * ms, 3, []op{
			acquire(0, "a", "", 0),
			done(10*ms, "a", ietf(`"q";r=1;t=1`, "")...),
			acquire(100*ms, "b", "", 100*ms),
			acquire(200*ms, "c", pacer.ReasonInFlight, -1),
			acquire(1010*ms, "c", "", 1010*ms),
		}},
		{"no remaining count, no budget", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			acquire(100*ms, "b", "", 100*ms),
			done(150*ms, "a", "RateLimit-Policy", `"q";q=1;w=60`),
			done(160*ms, "b"),
			{at: 200 * ms, kind: "acquire", id: "c", wantStart: 200 * ms, wantIv: 100 * ms},
		}},
		{"Confirm revokes a reserved start that a fresh reading leaves no room for", 100 * ms, 3, []op{
			acquire(0, "a", "", 0),
			acquire(100*ms, "b", "", 100*ms),
			{at: 150 * ms, kind: "acquire", id: "c", wait: time.Second, wantStart: 200 * ms, wantIv: -1},
			done(180*ms, "a", ietf(`"q";r=1;t=10`, "")...),
			{at: 200 * ms, kind: "confirm", id: "c", want: pacer.ReasonInFlight},
		}},
		{"nothing out and nothing left: the exhausted reset is the pause, then one goes", 100 * ms, 2, []op{
			acquire(0, "a", "", 0),
			done(10*ms, "a", ietf(`"q";r=0;t=2`, "")...),
			acquire(100*ms, "b", pacer.ReasonCooling, -1),
			acquire(2010*ms, "b", "", 2010*ms),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{
				Policy:     &pacer.Policy{Default: pacer.Limits{Floor: tt.floor, MaxInFlight: tt.cap}},
				StartGuard: -1,
				Rand:       fixedRand(0),
			})
			permits := map[string]pacer.Permit{}
			for i, o := range tt.ops {
				now := at(o.at)
				var pm pacer.Permit
				var err error
				switch o.kind {
				case "done":
					p.Done(now, permits[o.id], resp(o.status, o.h...))
					delete(permits, o.id)
					continue
				case "acquire":
					pm, err = p.Acquire(now, host, o.wait)
				case "confirm":
					pm, err = p.Confirm(now, permits[o.id])
				}
				var re *pacer.RefusedError
				switch {
				case o.want == "" && err != nil:
					t.Fatalf("step %d (%s %s at %v): %v, want a grant", i, o.kind, o.id, o.at, err)
				case o.want != "" && !errors.As(err, &re):
					t.Fatalf("step %d (%s %s at %v): granted (start %v), want %s", i, o.kind, o.id, o.at, pm.Start.Sub(t0), o.want)
				case o.want != "" && re.Reason != o.want:
					t.Fatalf("step %d (%s %s at %v): refused %s, want %s", i, o.kind, o.id, o.at, re.Reason, o.want)
				case o.want != "":
					continue
				}
				if o.wantStart >= 0 && !pm.Start.Equal(at(o.wantStart)) {
					t.Errorf("step %d (%s %s): start %v, want %v", i, o.kind, o.id, pm.Start.Sub(t0), o.wantStart)
				}
				if o.wantIv >= 0 && pm.Interval != o.wantIv {
					t.Errorf("step %d (%s %s): interval %v, want %v", i, o.kind, o.id, pm.Interval, o.wantIv)
				}
				if o.kind == "acquire" && pm.Start.Equal(now) {
					if pm, err = p.Confirm(now, pm); err != nil {
						t.Fatalf("step %d: confirm at the grant: %v", i, err)
					}
				}
				permits[o.id] = pm
			}
		})
	}
}
