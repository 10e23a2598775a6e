package pacer_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

func TestParsePolicy(t *testing.T) {
	p, err := pacer.ParsePolicy([]byte(`{
		"default": {"floor": "1500ms", "max_in_flight": 3},
		"authorities": {
			"files.example.org:443": {"floor": "250ms", "max_in_flight": 4},
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
		{"files.example.org:443", pacer.Limits{Floor: 250 * time.Millisecond, MaxInFlight: 4}},
		{"xn--bcher-kva.example:8443", pacer.Limits{Floor: 0, MaxInFlight: 3}},
		{"[2001:db8::1]:80", pacer.Limits{Floor: 1500 * time.Millisecond, MaxInFlight: 1}},
		{"other.example:443", pacer.Limits{Floor: 1500 * time.Millisecond, MaxInFlight: 3}},
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
		{`{"defaults":{}}`, `unknown field "defaults"`},
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
