package pacer_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

func TestParsePolicy(t *testing.T) {
	p, err := pacer.ParsePolicy([]byte(`{
		"default": {"floor": "1500ms", "max_in_flight": 3, "bandwidth": "10MiB/s"},
		"authorities": {
			"files.example.org:443": {"floor": "250ms", "max_in_flight": 4, "bandwidth": "512KiB/s"},
			"fast.example.org:443": {"bandwidth": "0"},
			"Bücher.Example:8443": {"floor": "0"},
			"[2001:DB8::1]:80": {"max_in_flight": 1}
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		auth string
		want pacer.Limits
	}{
		{"files.example.org:443", pacer.Limits{Floor: 250 * time.Millisecond, MaxInFlight: 4, Bandwidth: 512 << 10}},
		{"fast.example.org:443", pacer.Limits{Floor: 1500 * time.Millisecond, MaxInFlight: 3}},
		{"xn--bcher-kva.example:8443", pacer.Limits{Floor: 0, MaxInFlight: 3, Bandwidth: 10 << 20}},
		{"[2001:db8::1]:80", pacer.Limits{Floor: 1500 * time.Millisecond, MaxInFlight: 1, Bandwidth: 10 << 20}},
		{"other.example:443", pacer.Limits{Floor: 1500 * time.Millisecond, MaxInFlight: 3, Bandwidth: 10 << 20}},
	}
	for _, tt := range tests {
		if got := p.Limits(tt.auth); got != tt.want {
			t.Errorf("Limits(%s) = %+v, want %+v", tt.auth, got, tt.want)
		}
	}
	if q := p.WithDefaultFloor(5 * time.Second); q.Limits("x:1").Floor != 5*time.Second || q.Limits("files.example.org:443").Floor != 250*time.Millisecond || p.Default.Floor != 1500*time.Millisecond {
		t.Errorf("WithDefaultFloor: %+v (original %+v)", q, p)
	}
	var nilPolicy *pacer.Policy
	if got := nilPolicy.Limits("x:1"); got != (pacer.Limits{Floor: time.Second, MaxInFlight: 2}) {
		t.Errorf("nil policy limits %+v", got)
	}
	if got, err := pacer.ParsePolicy([]byte(`{}`)); err != nil || got.Default != (pacer.Limits{Floor: time.Second, MaxInFlight: 2}) {
		t.Errorf("empty policy %+v %v", got, err)
	}
}

func TestParsePolicyErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"default":{"floor":"fast"}}`, `default.floor: "fast" is not a duration`},
		{`{"default":{"floor":"-1s"}}`, `default.floor: -1s is outside 0 to 24h0m0s`},
		{`{"default":{"floor":1}}`, `cannot unmarshal number`},
		{`{"default":{"max_in_flight":0}}`, `default.max_in_flight: 0 is outside 1`},
		{`{"default":{"burst":3}}`, `unknown field "burst"`},
		{`{"default":{"bandwidth":"1MiB/h"}}`, `default.bandwidth: bytesize: invalid size`},
		{`{"default":{"bandwidth":"100/s"}}`, `default.bandwidth: 100/s is below the lowest cap, 1KiB/s`},
		{`{"authorities":{"a.org:443":{"bandwidth":1}}}`, `cannot unmarshal number`},
		{`{"defaults":{}}`, `unknown field "defaults"`},
		{`{"default":{"first_step":"0s"}}`, `default.first_step: 0s is outside 0 (excluded) to 1m0s`},
		{`{"default":{"first_step":"2 s"}}`, `default.first_step: "2 s" is not a duration`},
		{`{"authorities":{"a.org:443":{"decay":0}}}`, `authorities["a.org:443"].decay: 0 is outside 1`},
		{`{"authorities":{"example.org":{}}}`, `authorities["example.org"]: want "host:port"`},
		{`{"authorities":{"exa mple.org:443":{}}}`, `authorities["exa mple.org:443"]`},
		{`{"authorities":{"a.org:443":{"floor":"2x"}}}`, `authorities["a.org:443"].floor`},
		{`{"authorities":{"a.org:443":{"max_in_flight":-2}}}`, `authorities["a.org:443"].max_in_flight: -2`},
		{`{"authorities":{"A.org:443":{},"a.org:443":{}}}`, `duplicate of authority "a.org:443"`},
		{`{} {}`, `trailing data`},
		{`[`, `policy:`},
	}
	for _, tt := range tests {
		_, err := pacer.ParsePolicy([]byte(tt.in))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParsePolicy(%s) = %v, want an error containing %q", tt.in, err, tt.want)
		}
	}
}

func TestLoadPolicy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(path, []byte(`{"default":{"floor":"0"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := pacer.LoadPolicy(path)
	if err != nil || p.Default.Floor != 0 || p.Default.MaxInFlight != 2 {
		t.Fatalf("%+v %v", p, err)
	}
	if _, err := pacer.LoadPolicy(filepath.Join(dir, "missing.json")); err == nil {
		t.Fatal("missing file accepted")
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"default":{"floor":"x"}}`), 0o600)
	if _, err := pacer.LoadPolicy(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "default.floor") {
		t.Fatalf("error %v should name the file and the field", err)
	}
}

func TestSetPolicyAppliesFromTheNextRequest(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "origin.example:443"
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 4}}, StartGuard: -1})
	take := func(at time.Time, maxWait time.Duration) (pacer.Permit, error) {
		t.Helper()
		pm, err := p.Acquire(at, a, maxWait)
		if err == nil {
			if pm, err = p.Confirm(at, pm); err == nil && !pm.Start.After(at) {
				p.Done(at, pm, pacer.Response{Status: 200})
			}
		}
		return pm, err
	}
	if _, err := take(t0, 0); err != nil {
		t.Fatal(err)
	}
	// Lowered to 300 ms: the next request may go 300 ms after the last.
	p.SetPolicy(&pacer.Policy{Default: pacer.Limits{Floor: 300 * time.Millisecond, MaxInFlight: 4, Source: "kv:default"}})
	if _, err := take(t0.Add(299*time.Millisecond), 0); err == nil {
		t.Fatal("granted 299 ms after the last start at floor 300 ms")
	}
	if _, err := take(t0.Add(300*time.Millisecond), 0); err != nil {
		t.Fatalf("refused at the new floor: %v", err)
	}
	// A slot reserved on the 300 ms floor, then the floor rises to 2 s:
	// Confirm moves the start to 2 s after the last actual start.
	t1 := t0.Add(300 * time.Millisecond)
	pm, err := p.Acquire(t1.Add(100*time.Millisecond), a, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := t1.Add(300 * time.Millisecond); !pm.Start.Equal(want) {
		t.Fatalf("reserved start %v, want %v", pm.Start, want)
	}
	p.SetPolicy(&pacer.Policy{Default: pacer.Limits{Floor: 2 * time.Second, MaxInFlight: 1, Source: "kv:default"}})
	pm, err = p.Confirm(pm.Start, pm)
	if err != nil {
		t.Fatal(err)
	}
	if want := t1.Add(2 * time.Second); !pm.Start.Equal(want) {
		t.Fatalf("confirmed start %v after the floor rose to 2 s, want %v", pm.Start, want)
	}
	st := p.Snapshot(t1)
	if len(st) != 1 || st[0].Floor != 2*time.Second || st[0].MaxInFlight != 1 || st[0].PolicySource != "kv:default" {
		t.Fatalf("snapshot %+v, want floor 2s, cap 1, source kv:default", st)
	}
	// The cap of 1 is taken by the reservation.
	if _, err := p.Acquire(t1.Add(5*time.Second), a, 0); err == nil {
		t.Fatal("granted over the lowered in-flight cap")
	}
	p.Done(pm.Start, pm, pacer.Response{Status: 200})
	if _, err := take(pm.Start.Add(1999*time.Millisecond), 0); err == nil {
		t.Fatal("granted 1.999 s after a start at floor 2 s")
	}
	if _, err := take(pm.Start.Add(2*time.Second), 0); err != nil {
		t.Fatalf("refused at the new floor: %v", err)
	}
}

func TestSetPolicyKeepsAnEscalatedInterval(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "origin.example:443"
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}, StartGuard: -1})
	pm, err := p.Acquire(t0, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Done(t0, pm, pacer.Response{Status: 429})
	iv := p.Snapshot(t0)[0].Interval
	if iv <= time.Second {
		t.Fatalf("interval %v after a 429, want escalated", iv)
	}
	p.SetPolicy(&pacer.Policy{Default: pacer.Limits{Floor: 100 * time.Millisecond, MaxInFlight: 2}})
	if got := p.Snapshot(t0)[0]; got.Interval != iv || got.Floor != 100*time.Millisecond {
		t.Fatalf("after lowering the floor: interval %v floor %v, want %v and 100ms", got.Interval, got.Floor, iv)
	}
	p.SetPolicy(&pacer.Policy{Default: pacer.Limits{Floor: 5 * time.Minute, MaxInFlight: 2}})
	if got := p.Snapshot(t0)[0]; got.Interval != 5*time.Minute {
		t.Fatalf("after raising the floor above the interval: interval %v, want 5m", got.Interval)
	}
}

// TestConfirmRevokesReservationsOverALoweredCap: slots reserved under a
// cap that is then lowered must not all start. Each reservation that
// Confirm lets start would make one more request in flight at the origin,
// so Confirm revokes while the permits held (started or reserved) outnumber
// the cap in force, and lets the rest start: at no start are more requests
// in flight than the new cap.
func TestConfirmRevokesReservationsOverALoweredCap(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "origin.example:443"
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 4}}, StartGuard: -1})
	started, err := p.Acquire(t0, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	if started, err = p.Confirm(t0, started); err != nil || started.Start.After(t0) {
		t.Fatalf("first start: %v %v", started.Start, err)
	}
	var reserved []pacer.Permit
	for range 3 {
		pm, err := p.Acquire(t0, a, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		reserved = append(reserved, pm)
	}
	// Cap 4 to 2 (and floor 1 s to 0) while the first request is still in
	// flight: one more may start; two reservations are revoked.
	p.SetPolicy(&pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}})
	inFlight, revoked := 1, 0
	var at time.Time
	for _, pm := range reserved {
		at = pm.Start
		pm, err := p.Confirm(at, pm)
		var re *pacer.RefusedError
		switch {
		case errors.As(err, &re) && re.Reason == pacer.ReasonInFlight:
			revoked++
			p.Done(at, pm, pacer.Response{Cancelled: true})
		case err != nil:
			t.Fatalf("confirm: %v", err)
		case pm.Start.After(at):
			t.Fatalf("confirm moved the start to %v at floor 0", pm.Start)
		default:
			inFlight++
			if inFlight > 2 {
				t.Fatalf("%d requests in flight at a start, cap 2", inFlight)
			}
		}
	}
	if inFlight != 2 || revoked != 2 {
		t.Fatalf("%d in flight, %d revoked; want 2 and 2", inFlight, revoked)
	}
	if st := p.Snapshot(at)[0]; st.InFlight != 2 || st.MaxInFlight != 2 {
		t.Fatalf("snapshot in flight %d cap %d, want 2 and 2", st.InFlight, st.MaxInFlight)
	}
}

// first_step and decay tune the convergence per authority (ADR 0029); an
// authority's entry inherits the default's, like every other field.
func TestParsePolicyConvergence(t *testing.T) {
	p, err := pacer.ParsePolicy([]byte(`{"default":{"floor":"0","first_step":"500ms"},"authorities":{"a.org:443":{"decay":50}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Limits("a.org:443"); got.FirstStep != 500*time.Millisecond || got.Decay != 50 {
		t.Fatalf("a.org:443: %+v, want first step 500ms (the default's), decay 50", got)
	}
	if got := p.Limits("b.org:443"); got.FirstStep != 500*time.Millisecond || got.Decay != 0 {
		t.Fatalf("b.org:443: %+v, want first step 500ms, decay 0 (DefaultDecay)", got)
	}
	// Live: the first step applies from the next throttle, and status shows it.
	pc := pacer.New(&pacer.Options{Policy: pacer.DefaultPolicy().WithDefaultFloor(0), StartGuard: -1})
	pm, _ := pc.Acquire(t0, "a.org:443", 0)
	pc.SetPolicyAt(t0, p)
	pc.Done(t0, pm, resp(429, "Retry-After", "1"))
	st := pc.Snapshot(t0)[0]
	if st.Interval != 500*time.Millisecond || st.FirstStep != pacer.Duration(500*time.Millisecond) || st.Decay != 50 {
		t.Fatalf("state after a 429 under the new policy: %+v", st)
	}
}
