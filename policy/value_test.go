package policy_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/policy"
)

func TestKeyRoundTrip(t *testing.T) {
	tests := []struct {
		auth, key, back string
	}{
		{auth: "files.example.org:443", key: "auth.files.example.org.443", back: "files.example.org:443"},
		{auth: "Files.Example.ORG:8080", key: "auth.files.example.org.8080", back: "files.example.org:8080"},
		{auth: "127.0.0.1:8080", key: "auth.127.0.0.1.8080", back: "127.0.0.1:8080"},
		{auth: "Bücher.example:443", key: "auth.xn--bcher-kva.example.443", back: "xn--bcher-kva.example:443"},
		{auth: "[2001:DB8::1]:80", back: "[2001:db8::1]:80"},
		{auth: "default", key: "default", back: "default"},
	}
	for _, tt := range tests {
		t.Run(tt.auth, func(t *testing.T) {
			key, err := policy.Key(tt.auth)
			if err != nil {
				t.Fatal(err)
			}
			if tt.key != "" && key != tt.key {
				t.Errorf("Key(%q) = %q, want %q", tt.auth, key, tt.key)
			}
			back, err := policy.ParseKey(key)
			if err != nil || back != tt.back {
				t.Errorf("ParseKey(%q) = %q, %v; want %q", key, back, err, tt.back)
			}
		})
	}
	for _, bad := range []string{"", "files.example.org:443", "auth.files", "auth.Files.example.443", "auth.a.b.notaport", "authx.!!", "other.x.1"} {
		if a, err := policy.ParseKey(bad); !errors.Is(err, policy.ErrInvalid) {
			t.Errorf("ParseKey(%q) = %q, %v; want ErrInvalid", bad, a, err)
		}
	}
	for _, bad := range []string{"files.example.org", "http://x/", "a b:1"} {
		if k, err := policy.Key(bad); !errors.Is(err, policy.ErrInvalid) {
			t.Errorf("Key(%q) = %q, %v; want ErrInvalid", bad, k, err)
		}
	}
}

func TestParseValue(t *testing.T) {
	v, err := policy.ParseValue([]byte(`{"floor":"300ms","max_in_flight":3,"bandwidth":"1MiB/s","until":"2026-12-01T18:00:00Z","reason":"maintenance"}`))
	if err != nil {
		t.Fatal(err)
	}
	if *v.Floor != 300*time.Millisecond || *v.MaxInFlight != 3 || *v.Bandwidth != 1<<20 || v.Reason != "maintenance" ||
		!v.Until.Equal(time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)) {
		t.Fatalf("parsed %+v", v)
	}
	data, err := v.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"bandwidth":"1MiB/s"`) {
		t.Errorf("bandwidth not written as a rate: %s", data)
	}
	if w, err := policy.ParseValue(data); err != nil || *w.Floor != *v.Floor || *w.MaxInFlight != *v.MaxInFlight || *w.Bandwidth != *v.Bandwidth || !w.Until.Equal(v.Until) {
		t.Fatalf("round trip %s: %+v, %v", data, w, err)
	}
	// The convergence settings alone make a value, written as a duration
	// and a count, and merge over the layers below.
	c, err := policy.ParseValue([]byte(`{"first_step":"1.5s","decay":200}`))
	if err != nil || *c.FirstStep != 1500*time.Millisecond || *c.Decay != 200 {
		t.Fatalf("convergence value: %+v, %v", c, err)
	}
	if data, _ := c.MarshalJSON(); !strings.Contains(string(data), `"first_step":"1.5s","decay":200`) {
		t.Errorf("convergence written as %s", data)
	}
	merged, _ := policy.Merge(nil, map[string]policy.Value{"a.example:443": c}, time.Now())
	if l := merged.Limits("a.example:443"); l.FirstStep != 1500*time.Millisecond || l.Decay != 200 || l.Floor != pacer.DefaultFloor {
		t.Errorf("merged: %+v", l)
	}
	for _, tt := range []struct{ in, want string }{
		{`{}`, "none of floor, max_in_flight, bandwidth, first_step, decay and members"},
		{`{"bandwidth":"fast"}`, `bandwidth: "fast" is not a rate`},
		{`{"bandwidth":"10/s"}`, "bandwidth: 10/s is below the lowest cap"},
		{`{"floor":"1 second"}`, `"1 second" is not a duration`},
		{`{"floor":"-1s"}`, "outside 0 to 24h"},
		{`{"floor":"25h"}`, "outside 0 to 24h"},
		{`{"max_in_flight":0}`, "max_in_flight: 0 is outside"},
		{`{"floor":"1s","burst":2}`, "unknown field"},
		{`{"first_step":"soon"}`, `first_step: "soon" is not a duration`},
		{`{"first_step":"2m"}`, "first_step: 2m0s is outside"},
		{`{"decay":0}`, "decay: 0 is outside 1"},
		{`{"floor":"1s"} {}`, "trailing data"},
	} {
		_, err := policy.ParseValue([]byte(tt.in))
		if !errors.Is(err, policy.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseValue(%s) = %v, want ErrInvalid with %q", tt.in, err, tt.want)
		}
	}
}

func dur(d time.Duration) *time.Duration { return &d }
func num(n int) *int                     { return &n }
func rate(n int64) *int64                { return &n }

// TestMergePrecedence: the authority's key, then its file entry, then the
// default key, then the static default; unset fields from the level below;
// values past their until left out, and the next until reported.
func TestMergePrecedence(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	base := &pacer.Policy{
		Default:     pacer.Limits{Floor: time.Second, MaxInFlight: 2},
		Authorities: map[string]pacer.Limits{"file.example:443": {Floor: 5 * time.Second, MaxInFlight: 1, Bandwidth: 4 << 20}},
	}
	vals := map[string]policy.Value{
		policy.DefaultKey:      {Floor: dur(2 * time.Second), Bandwidth: rate(1 << 20)},
		"file.example:443":     {MaxInFlight: num(4), Until: now.Add(time.Hour)},
		"uncapped.example:443": {Bandwidth: rate(0)},
		"kv.example:443":       {Floor: dur(300 * time.Millisecond), Until: now.Add(10 * time.Minute)},
		"ended.example:443":    {Floor: dur(0), MaxInFlight: num(9), Until: now},
	}
	p, next := policy.Merge(base, vals, now)
	tests := []struct {
		auth string
		want pacer.Limits
	}{
		{"file.example:443", pacer.Limits{Floor: 5 * time.Second, MaxInFlight: 4, Bandwidth: 4 << 20, Source: policy.SourceKV}},
		{"kv.example:443", pacer.Limits{Floor: 300 * time.Millisecond, MaxInFlight: 2, Bandwidth: 1 << 20, Source: policy.SourceKV}},
		{"uncapped.example:443", pacer.Limits{Floor: 2 * time.Second, MaxInFlight: 2, Source: policy.SourceKV}},
		{"ended.example:443", pacer.Limits{Floor: 2 * time.Second, MaxInFlight: 2, Bandwidth: 1 << 20, Source: policy.SourceDefault}},
		{"other.example:443", pacer.Limits{Floor: 2 * time.Second, MaxInFlight: 2, Bandwidth: 1 << 20, Source: policy.SourceDefault}},
	}
	for _, tt := range tests {
		if got := p.Limits(tt.auth); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.auth, got, tt.want)
		}
	}
	if !next.Equal(now.Add(10 * time.Minute)) {
		t.Errorf("next = %v, want the earliest until ahead %v", next, now.Add(10*time.Minute))
	}
	// Later: both overrides ended; the file entry and the default key remain.
	p, next = policy.Merge(base, vals, now.Add(2*time.Hour))
	if got := p.Limits("file.example:443"); got != (pacer.Limits{Floor: 5 * time.Second, MaxInFlight: 1, Bandwidth: 4 << 20, Source: policy.SourceFile}) {
		t.Errorf("file entry after its override ended: %+v", got)
	}
	if got := p.Limits("kv.example:443"); got.Source != policy.SourceDefault || got.Floor != 2*time.Second {
		t.Errorf("kv.example after its until: %+v", got)
	}
	if !next.IsZero() {
		t.Errorf("next = %v after every until, want zero", next)
	}
	// No values: the static policy, labelled.
	p, _ = policy.Merge(base, nil, now)
	if got := p.Limits("x.example:80"); got != (pacer.Limits{Floor: time.Second, MaxInFlight: 2, Source: policy.SourceStatic}) {
		t.Errorf("static default: %+v", got)
	}
}

func TestGroupKeysAndMerge(t *testing.T) {
	key, err := policy.Key("group:web")
	if err != nil || key != "group.web" {
		t.Fatalf("Key(group:web) = %q, %v", key, err)
	}
	if back, err := policy.ParseKey(key); err != nil || back != "group:web" {
		t.Fatalf("ParseKey(%q) = %q, %v", key, back, err)
	}
	for _, bad := range []string{"group:Web", "group:", "group:9"} {
		if _, err := policy.Key(bad); !errors.Is(err, policy.ErrInvalid) {
			t.Errorf("Key(%q): %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := policy.ParseKey("group.a_b"); !errors.Is(err, policy.ErrInvalid) {
		t.Errorf("ParseKey(group.a_b): %v, want ErrInvalid", err)
	}
	if _, err := policy.ParseValue([]byte(`{"members": ["*example.org"]}`)); !errors.Is(err, policy.ErrInvalid) {
		t.Errorf("a pattern without *.: %v, want ErrInvalid", err)
	}
	if err := policy.CheckKeyValue("a.example:80", policy.Value{Members: []string{"b.example:80"}}); err == nil {
		t.Error("an authority's key with members passed CheckKeyValue")
	}

	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	fileGroup, _ := pacer.NewGroup([]string{"a.example:80", "b.example:80"})
	fileGroup.Limits = pacer.Limits{Floor: 3 * time.Second, MaxInFlight: 1}
	base := &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2},
		Groups: map[string]pacer.Group{"file": fileGroup}}
	vals := map[string]policy.Value{
		// Only a floor: the file's members stay.
		"group:file": {Floor: dur(500 * time.Millisecond)},
		// A group of the bucket alone, under the default.
		"group:kv": {Members: []string{"*.kv.example"}, Bandwidth: rate(1 << 20)},
		// No members anywhere: not a group.
		"group:empty": {Floor: dur(time.Second)},
		// Ended: not a group.
		"group:ended": {Members: []string{"e.example:80"}, Until: now},
	}
	p, _ := policy.Merge(base, vals, now)
	if got := p.GroupNames(); strings.Join(got, ",") != "file,kv" {
		t.Fatalf("groups %v, want file,kv", got)
	}
	if g := p.Groups["file"]; strings.Join(g.Members, ",") != "a.example:80,b.example:80" ||
		g.Limits != (pacer.Limits{Floor: 500 * time.Millisecond, MaxInFlight: 1, Source: policy.SourceKV}) {
		t.Errorf("file group %+v", g)
	}
	if got := p.Limits(p.PaceKey("x.kv.example:443")); got != (pacer.Limits{Floor: time.Second, MaxInFlight: 2, Bandwidth: 1 << 20, Source: policy.SourceKV}) {
		t.Errorf("kv group's limits %+v", got)
	}
	if k := p.PaceKey("e.example:80"); k != "e.example:80" {
		t.Errorf("an ended group still paces its member: %s", k)
	}
	// Without the bucket's values, the file's group as it was.
	p, _ = policy.Merge(base, nil, now)
	if got := p.Limits("group:file"); got != (pacer.Limits{Floor: 3 * time.Second, MaxInFlight: 1, Source: policy.SourceFile}) {
		t.Errorf("file group alone %+v", got)
	}
}
