package loadtest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// Profile is a load-test profile: the stub origin's admission policy and the
// politeness every strategy runs with (floor, in-flight cap, time scale).
//
// The file is either a plain stub origin profile (then floor 1 s, cap 2,
// scale 1), or an object with the load-test fields and the origin profile
// under "origin":
//
//	{
//	  "name": "loadtest-throttling",
//	  "scale": 0.002,
//	  "floor": "100ms",
//	  "max_in_flight": 2,
//	  "origin": { ...a stub origin profile (stuborigin.Profile)... }
//	}
type Profile struct {
	Name        string
	Description string
	// Scale multiplies the strategies' time constants (see package
	// strategy); 1 is real time.
	Scale       float64
	Floor       time.Duration
	MaxInFlight int
	// ObjectSize is the size of each object the jobs ask for; default 1024.
	ObjectSize int64
	Origin     *stuborigin.Profile
}

type profileFile struct {
	Name        string              `json:"name"`
	Description string              `json:"description,omitempty"`
	Scale       float64             `json:"scale"`
	Floor       stuborigin.Duration `json:"floor"`
	MaxInFlight int                 `json:"max_in_flight"`
	ObjectSize  int64               `json:"object_size,omitempty"`
	Origin      json.RawMessage     `json:"origin"`
}

// LoadProfile reads a load-test profile (or a plain stub origin profile).
//
// An empty path is the default profile, built into the binary
// (DefaultProfileFile), so that the default works from any directory.
func LoadProfile(path string) (*Profile, error) {
	if path == "" {
		return ParseProfile(defaultProfile)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	p, err := ParseProfile(b)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", path, err)
	}
	return p, nil
}

// ParseProfile decodes and validates a load-test profile. Unknown fields are
// errors.
func ParseProfile(b []byte) (*Profile, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if _, ok := probe["origin"]; !ok {
		op, err := stuborigin.ParseProfile(b)
		if err != nil {
			return nil, err
		}
		return &Profile{Name: op.Name, Description: op.Description, Scale: 1, Floor: time.Second, MaxInFlight: 2, ObjectSize: 1024, Origin: op}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f profileFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	op, err := stuborigin.ParseProfile(f.Origin)
	if err != nil {
		return nil, fmt.Errorf("origin: %w", err)
	}
	p := &Profile{Name: f.Name, Description: f.Description, Scale: f.Scale, Floor: f.Floor.Duration,
		MaxInFlight: f.MaxInFlight, ObjectSize: f.ObjectSize, Origin: op}
	if p.Name == "" {
		p.Name = op.Name
	}
	if _, ok := probe["floor"]; !ok {
		p.Floor = time.Second
	}
	if p.MaxInFlight == 0 {
		p.MaxInFlight = 2
	}
	if p.ObjectSize == 0 {
		p.ObjectSize = 1024
	}
	var errs []error
	if !(p.Scale > 0 && p.Scale <= 1) {
		errs = append(errs, fmt.Errorf("scale: must be in (0, 1], got %v", f.Scale))
	}
	if p.Floor < 0 {
		errs = append(errs, fmt.Errorf("floor: must not be negative"))
	}
	if p.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("max_in_flight: must be at least 1"))
	}
	if p.ObjectSize < 0 {
		errs = append(errs, fmt.Errorf("object_size: must not be negative"))
	}
	if _, ok := op.Quotas["anonymous"]; !ok && !op.ProxyLimited() {
		errs = append(errs, errors.New("origin.quotas.anonymous: required (the workers call without a token)"))
	}
	return p, errors.Join(errs...)
}

// RealTime returns a copy of p whose strategies run at real time (Scale 1):
// the contract's 2 s first step, 60-600 s cooldowns and 30 min quiet window,
// so that compressing time cannot hide what they cost. The origin profile is
// shared with p and unchanged: its quotas are the origin's own time.
func (p *Profile) RealTime() *Profile {
	q := *p
	q.Scale = 1
	return &q
}

// AllowedAdmissions is how many requests the profile admits in d from a
// start with full buckets, at most: per authority and identity, the least
// of the anonymous burst bucket's capacity plus its refill over d, the
// sustained bucket's capacity plus its rate times d, and the shared
// shard's tenant share of each window begun in d. No caller, however it
// spreads its requests, is admitted more by d; a greedy one gets this.
func (p *Profile) AllowedAdmissions(authorities, identities int, d time.Duration) float64 {
	if p.Origin.ProxyLimited() {
		return p.Origin.ProxyAllowance(d) * float64(authorities*identities)
	}
	q, ok := p.Origin.Quotas["anonymous"]
	if !ok || q.Sustained.Window.Duration <= 0 {
		return 0
	}
	per := float64(q.Sustained.Capacity) + float64(q.Sustained.Capacity)/q.Sustained.Window.Seconds()*d.Seconds()
	if q.Burst.RefillPerSecond > 0 {
		per = math.Min(per, math.Floor(float64(q.Burst.Capacity)+q.Burst.RefillPerSecond*d.Seconds()))
	}
	if s := p.Origin.Shard; s.Capacity > 0 && s.Window.Duration > 0 {
		slots := math.Max(math.Floor(float64(s.Capacity)*s.TenantShare), 1)
		windows := math.Ceil(d.Seconds() / s.Window.Seconds())
		per = math.Min(per, slots*windows)
	}
	return per * float64(authorities*identities)
}

// AllowedRate is what the profile allows a load test with this many
// authorities, in admitted requests per second: the anonymous sustained
// quota (the workers send no token, and all of them call from 127.0.0.1,
// one identity per authority) summed over authorities.
func (p *Profile) AllowedRate(authorities, identities int) float64 {
	return p.Origin.SustainedRate("anonymous") * float64(authorities*identities)
}

// DefaultProfileFile is the repository's file of the default profile,
// which LoadProfile("") reads from a copy built into the binary
// (default-profile.json, kept identical by TestDefaultProfileIsTheFile).
const DefaultProfileFile = "testdata/profiles/loadtest-throttling.json"

//go:embed default-profile.json
var defaultProfile []byte
