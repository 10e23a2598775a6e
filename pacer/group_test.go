package pacer_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

func TestGroupOfPrecedence(t *testing.T) {
	p, err := pacer.ParsePolicy([]byte(`{"groups": {
		"named":  {"members": ["www.example.org:443"]},
		"wide":   {"members": ["*.example.org"]},
		"narrow": {"members": ["*.cdn.example.org"]},
		"port":   {"members": ["*.example.org:8443"]},
		"other":  {"members": ["Files.Example.NET:80"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for auth, want := range map[string]string{
		"www.example.org:443":    "named",  // by name beats every pattern
		"a.example.org:443":      "wide",   // any port
		"a.b.example.org:80":     "wide",   // any depth
		"x.cdn.example.org:443":  "narrow", // the longer domain
		"a.example.org:8443":     "port",   // the same domain, with its port
		"x.cdn.example.org:8443": "narrow", // a longer domain beats a port
		"example.org:443":        "",       // a pattern does not match the domain itself
		"badexample.org:443":     "",       // nor a host that only ends in its letters
		"files.example.net:80":   "other",  // members are normalised
		"files.example.net:443":  "",
	} {
		if got := p.GroupOf(auth); got != want {
			t.Errorf("GroupOf(%s) = %q, want %q", auth, got, want)
		}
		if want != "" {
			if k := p.PaceKey(auth); k != "group:"+want {
				t.Errorf("PaceKey(%s) = %q", auth, k)
			}
		} else if k := p.PaceKey(auth); k != auth {
			t.Errorf("PaceKey(%s) = %q, want itself", auth, k)
		}
	}
}

func TestParsePolicyGroupErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"groups": {"Web": {"members": ["a.example:80"]}}}`, "group name"},
		{`{"groups": {"9web": {"members": ["a.example:80"]}}}`, "group name"},
		{`{"groups": {"web": {"members": []}}}`, "at least one member"},
		{`{"groups": {"web": {"members": ["a.example"]}}}`, `"host:port"`},
		{`{"groups": {"web": {"members": ["*example.org"]}}}`, `starts with "*."`},
		{`{"groups": {"web": {"members": ["*.127.0.0.1"]}}}`, "domain, not an address"},
		{`{"groups": {"a": {"members": ["x.example:80"]}, "b": {"members": ["x.example:80"]}}}`, "also a member of group"},
		{`{"authorities": {"x.example:80": {"floor": "2s"}}, "groups": {"a": {"members": ["x.example:80"]}}}`, "limits of its own"},
		{`{"groups": {"web": {"members": ["a.example:80"], "floor": "soon"}}}`, `groups["web"].floor`},
		{`{"groups": {"web": {"members": ["a.example:80"], "color": "red"}}}`, "unknown field"},
	} {
		_, err := pacer.ParsePolicy([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
}

// groupPolicy is floor 1 s, cap 2 by default, with one group of a and b at
// floor 500 ms, cap 1.
func groupPolicy(members ...string) *pacer.Policy {
	p := &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}
	if len(members) > 0 {
		g, err := pacer.NewGroup(members)
		if err != nil {
			panic(err)
		}
		g.Limits = pacer.Limits{Floor: 500 * time.Millisecond, MaxInFlight: 1}
		p.Groups = map[string]pacer.Group{"web": g}
	}
	return p
}

func TestGroupIsOnePace(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a, b, c = "a.example:80", "b.example:80", "c.example:80"
	p := pacer.New(&pacer.Options{Policy: groupPolicy(a, b), StartGuard: -1})
	pa, err := p.Acquire(t0, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	if pa, err = p.Confirm(t0, pa); err != nil {
		t.Fatal(err)
	}
	// The group's cap is 1: b waits for a's request, c (no group) does not.
	var re *pacer.RefusedError
	if _, err := p.Acquire(t0, b, time.Minute); !errors.As(err, &re) || re.Reason != pacer.ReasonInFlight {
		t.Fatalf("b while a's request runs: %v, want refused for the group's in-flight cap", err)
	}
	if _, err := p.Acquire(t0, c, 0); err != nil {
		t.Fatalf("c is in no group: %v", err)
	}
	p.Done(t0.Add(10*time.Millisecond), pa, pacer.Response{Status: 200})
	// The group's floor spaces b from a's start.
	pb, err := p.Acquire(t0.Add(10*time.Millisecond), b, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(500 * time.Millisecond); !pb.Start.Equal(want) {
		t.Fatalf("b's start %v, want the group's floor after a's: %v", pb.Start, want)
	}
	pb, _ = p.Confirm(pb.Start, pb)
	// b's 429 cools the whole group: a waits for it, and one probe goes.
	t1 := pb.Start.Add(20 * time.Millisecond)
	v := p.Done(t1, pb, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"5"}}})
	if !v.Throttled {
		t.Fatal("429 not read as throttling")
	}
	if _, err := p.Acquire(t1, a, 0); !errors.As(err, &re) || re.Reason != pacer.ReasonCooling {
		t.Fatalf("a after b's 429: %v, want cooling", err)
	}
	st := p.Snapshot(t1)
	found := false
	for _, s := range st {
		if s.Authority == "group:web" {
			found = s.State == pacer.StateCooling && s.Floor == 500*time.Millisecond
		}
		if s.Authority == a || s.Authority == b {
			t.Errorf("a member has an entry of its own: %+v", s)
		}
	}
	if !found {
		t.Fatalf("no cooling group:web in the snapshot: %+v", st)
	}
	t2 := t1.Add(5 * time.Second)
	probe, err := p.Acquire(t2, a, 0)
	if err != nil || !probe.Probe {
		t.Fatalf("after the cooldown: %+v %v, want the probe", probe, err)
	}
	if _, err := p.Acquire(t2.Add(time.Second), b, 0); !errors.As(err, &re) || re.Reason != pacer.ReasonProbing {
		t.Fatalf("b while a's probe runs: %v, want probing", err)
	}
}

func TestJoiningAGroupKeepsEveryPromise(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a, b = "a.example:80", "b.example:80"
	p := pacer.New(&pacer.Options{Policy: groupPolicy(b), StartGuard: -1})
	// a cools on its own; b's group serves a request.
	pa, _ := p.Acquire(t0, a, 0)
	pa, _ = p.Confirm(t0, pa)
	p.Done(t0.Add(10*time.Millisecond), pa, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"3"}}})
	pb, _ := p.Acquire(t0, b, 0)
	pb, _ = p.Confirm(t0, pb)
	p.Done(t0.Add(10*time.Millisecond), pb, pacer.Response{Status: 200})
	// A permit of a's own, reserved before the change.
	reserved, err := p.Acquire(t0.Add(4*time.Second), "c.example:80", 0)
	if err != nil {
		t.Fatal(err)
	}
	// a and c join the group at t1: the group takes a's cooldown, and holds
	// its next start MoveSettle plus its floor after the change.
	t1 := t0.Add(time.Second)
	p.SetPolicyAt(t1, groupPolicy(a, b, "c.example:80"))
	var re *pacer.RefusedError
	if _, err := p.Acquire(t1, b, time.Minute); !errors.As(err, &re) || re.Reason != pacer.ReasonCooling {
		t.Fatalf("b after a, cooling, joined its group: %v, want cooling", err)
	}
	if _, err := p.Confirm(t0.Add(4*time.Second), reserved); !errors.As(err, &re) {
		t.Fatal("a permit granted under c's own pace was confirmed after c joined a group")
	}
	p.Done(t0.Add(4*time.Second), reserved, pacer.Response{Cancelled: true})
	// The probe after a's cooldown (ends at t0+3.01 s) is held to the change
	// plus MoveSettle plus the floor.
	t2 := t0.Add(3100 * time.Millisecond)
	pm, err := p.Acquire(t2, b, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := t1.Add(pacer.MoveSettle + 500*time.Millisecond); pm.Start.Before(want) || !pm.Probe {
		t.Fatalf("first start after the move %v (probe %v), want the probe no sooner than %v", pm.Start, pm.Probe, want)
	}
}

func TestLeavingAGroupTakesItsStateAlong(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a, b = "a.example:80", "b.example:80"
	p := pacer.New(&pacer.Options{Policy: groupPolicy(a, b), StartGuard: -1})
	pa, _ := p.Acquire(t0, a, 0)
	pa, _ = p.Confirm(t0, pa)
	// a's request is in flight when a leaves the group; its 429 arrives
	// after: it cools a's new pace as well as the group's.
	t1 := t0.Add(100 * time.Millisecond)
	p.SetPolicyAt(t1, groupPolicy(b))
	p.Done(t1.Add(10*time.Millisecond), pa, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"4"}}})
	var re *pacer.RefusedError
	for _, auth := range []string{a, b} {
		if _, err := p.Acquire(t1.Add(time.Second), auth, 0); !errors.As(err, &re) || re.Reason != pacer.ReasonCooling {
			t.Errorf("%s after a's 429 in flight across the move: %v, want cooling", auth, err)
		}
	}
	// b's group and a each wait out the cooldown; a's pace starts no
	// sooner than the change plus MoveSettle plus its floor (1 s).
	wait, _, reason := p.ReadyIn(t1.Add(5*time.Second), a)
	if reason != pacer.ReasonProbing || wait != 0 {
		t.Fatalf("a at the cooldown's end: wait %s %s, want its probe", wait, reason)
	}
}

func TestSetPolicyWithoutGroupChangesFencesNothing(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "a.example:80"
	p := pacer.New(&pacer.Options{Policy: groupPolicy(a), StartGuard: -1})
	pm, _ := p.Acquire(t0, a, 0)
	pm, _ = p.Confirm(t0, pm)
	p.Done(t0, pm, pacer.Response{Status: 200})
	// A floor change with the same members: no MoveSettle hold.
	q := groupPolicy(a)
	q.Default.Floor = 2 * time.Second
	p.SetPolicyAt(t0.Add(100*time.Millisecond), q)
	if _, err := p.Acquire(t0.Add(500*time.Millisecond), a, 0); err != nil {
		t.Fatalf("the group's floor (500 ms) after an unrelated change: %v", err)
	}
}

// TestLeavingAGroupTakesALearnedCooldownAlong: a pod that knows a group's
// cooldown only from another pod's fact (it never served a member itself)
// still hands it to a member that leaves: the member's new pace waits the
// cooldown out and starts with the probe the group owed.
func TestLeavingAGroupTakesALearnedCooldownAlong(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a, b = "a.example:80", "b.example:80"
	p := pacer.New(&pacer.Options{Policy: groupPolicy(a, b), StartGuard: -1})
	p.Apply(t0, pacer.Event{Type: pacer.EventCooldown, Authority: "group:web", At: t0,
		Until: t0.Add(5 * time.Second), Interval: 2 * time.Second})
	t1 := t0.Add(time.Second)
	p.SetPolicyAt(t1, groupPolicy(b))
	var re *pacer.RefusedError
	if _, err := p.Acquire(t0.Add(4*time.Second), a, 0); !errors.As(err, &re) || re.Reason != pacer.ReasonCooling {
		t.Fatalf("a, out of the cooling group, before the cooldown's end: %v, want cooling", err)
	}
	pm, err := p.Acquire(t0.Add(6*time.Second), a, 0)
	if err != nil || !pm.Probe {
		t.Fatalf("a after the cooldown: %+v %v, want the probe", pm, err)
	}
	if _, err := p.Acquire(t0.Add(6*time.Second), a, 0); !errors.As(err, &re) || re.Reason != pacer.ReasonProbing {
		t.Fatalf("a while its probe runs: %v, want probing", err)
	}
}

// TestAGroupsLateFactBindsAMemberThatLeft: a group's cooldown told before
// a change that takes a member out, whose fact reaches this pod only after
// it applied the change (a slow link), binds the member's new pace too, as
// the change would have carried it had the fact come first.
func TestAGroupsLateFactBindsAMemberThatLeft(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a, b = "a.example:80", "b.example:80"
	p := pacer.New(&pacer.Options{Policy: groupPolicy(a, b), StartGuard: -1})
	pm, _ := p.Acquire(t0, a, 0)
	pm, _ = p.Confirm(t0, pm)
	p.Done(t0.Add(10*time.Millisecond), pm, pacer.Response{Status: 200})
	// Another pod's 429 to the group at t1-50ms; this pod applies the
	// change at t1 and reads the fact at t1+50ms.
	t1 := t0.Add(5 * time.Second)
	p.SetPolicyAt(t1, groupPolicy(b))
	told := t1.Add(-50 * time.Millisecond)
	p.Apply(t1.Add(50*time.Millisecond), pacer.Event{Type: pacer.EventCooldown, Authority: "group:web", At: told,
		Until: told.Add(4 * time.Second), Interval: 600 * time.Millisecond})
	var re *pacer.RefusedError
	if _, err := p.Acquire(t1.Add(2500*time.Millisecond), a, 0); !errors.As(err, &re) || re.Reason != pacer.ReasonCooling {
		t.Fatalf("a, out of the group, inside the group's Retry-After told before the change: %v, want cooling", err)
	}
	if pm, err := p.Acquire(told.Add(4*time.Second), a, 0); err != nil || !pm.Probe {
		t.Fatalf("a at the cooldown's end: %+v %v, want the probe", pm, err)
	}
	// A fact told after the change is the group's alone.
	p.Apply(t1.Add(5*time.Second), pacer.Event{Type: pacer.EventCooldown, Authority: "group:web", At: t1.Add(5 * time.Second),
		Until: t1.Add(9 * time.Second)})
	if wait, _, reason := p.ReadyIn(t1.Add(6*time.Second), a); reason == pacer.ReasonCooling {
		t.Fatalf("a after a cooldown the group was told after a left: wait %s %s, want no cooldown", wait, reason)
	}
}

// TestAPatternMemberLeavingTakesTheGroupsStateAlong: a member matched by a
// pattern, which a pod cannot list, that leaves its group on a pod that
// never served it: its first request under its own pace waits out the
// group's cooldown, then starts as the probe, no sooner than the change
// plus MoveSettle plus its floor.
func TestAPatternMemberLeavingTakesTheGroupsStateAlong(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "a.example.org:80"
	p := pacer.New(&pacer.Options{Policy: groupPolicy("*.example.org"), StartGuard: -1})
	p.Apply(t0, pacer.Event{Type: pacer.EventCooldown, Authority: "group:web", At: t0, Until: t0.Add(3 * time.Second)})
	t1 := t0.Add(time.Second)
	p.SetPolicyAt(t1, groupPolicy("b.example.org:80"))
	var re *pacer.RefusedError
	if _, err := p.Acquire(t0.Add(2*time.Second), a, 0); !errors.As(err, &re) || re.Reason != pacer.ReasonCooling {
		t.Fatalf("a, out of the cooling group, before the cooldown's end: %v, want cooling", err)
	}
	pm, err := p.Acquire(t0.Add(3100*time.Millisecond), a, time.Minute)
	if err != nil || !pm.Probe {
		t.Fatalf("a after the cooldown: %+v %v, want the probe", pm, err)
	}
	if want := t1.Add(pacer.MoveSettle + time.Second); pm.Start.Before(want) {
		t.Fatalf("a's first start %v, want no sooner than the change plus MoveSettle plus its floor (%v)", pm.Start, want)
	}
	// Long after, a new authority the old pattern matched owes nothing.
	late := t0.Add(time.Hour)
	if pm, err := p.Acquire(late, "c.example.org:80", 0); err != nil || pm.Probe || !pm.Start.Equal(late) {
		t.Fatalf("a new member of the old pattern an hour later: %+v %v, want a plain start now", pm, err)
	}
}
