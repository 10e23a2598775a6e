package pacer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/bytesize"
)

// Policy defaults (docs/contract.md section 3).
const (
	DefaultFloor       = time.Second
	DefaultMaxInFlight = 2
	MaxPolicyFloor     = 24 * time.Hour // a larger floor is far more likely a typo than a wish
	MaxPolicyInFlight  = 1 << 16        // the largest in-flight cap a policy may give
	// MinPolicyBandwidth is the lowest bandwidth cap a policy may give
	// (bytes per second; 0 is no cap): below it a body of any size takes
	// hours, more likely a typo than a wish.
	MinPolicyBandwidth = 1 << 10
)

// Limits is the issuer's politeness for one authority.
type Limits struct {
	Floor       time.Duration // minimum spacing between requests (starts, and writes: Pacer.Sent); may be 0
	MaxInFlight int           // concurrent requests; at least 1
	// Bandwidth caps the bytes per second of all the authority's bodies in
	// flight on the pod that serves it (package bandwidth spends it on body
	// reads; the pacer does not read it); 0: no cap.
	Bandwidth int64
	// Source says where these limits come from, for status and
	// /debug/pacer (package policy fills it: "kv:default", "file", ...);
	// ParsePolicy leaves it empty. The pacer does not read it otherwise.
	Source string
	// FirstStep is the first escalation step above a small interval,
	// at every escalation (0: the contract's FirstStep, scaled by
	// Options.Scale, until a pace is learned; then twice the pace and
	// what the bucket needs to drain, at most FirstStep); Decay is how
	// many answers halve the interval once it is at the pace learned from
	// the origin (0: DefaultDecay). ADR 0029.
	FirstStep time.Duration
	Decay     int
}

// Policy holds the limits (floor, in-flight cap, bandwidth, first step,
// decay): a default, per-authority overrides keyed by normalised
// "host:port", and groups. A nil *Policy is the default policy (floor 1 s,
// cap 2). A Policy is read-only once built and safe for
// concurrent use.
type Policy struct {
	Default     Limits
	Authorities map[string]Limits
	// Groups are the politeness groups by name (group.go): each member's
	// requests are paced as one, by the group's limits.
	Groups map[string]Group
}

// DefaultPolicy returns the policy with the defaults and no overrides.
func DefaultPolicy() *Policy {
	return &Policy{Default: Limits{Floor: DefaultFloor, MaxInFlight: DefaultMaxInFlight}}
}

// Limits returns the limits for a pace key: the authority "host:port", or
// a group's "group:NAME" (a group that does not exist has the default). An
// authority's own limits are its pace's only when it is in no group: ask
// with PaceKey(auth) for the limits a request to it is paced by.
func (p *Policy) Limits(key string) Limits {
	if p == nil {
		return Limits{Floor: DefaultFloor, MaxInFlight: DefaultMaxInFlight}
	}
	if name, ok := strings.CutPrefix(key, GroupPrefix); ok {
		if g, ok := p.Groups[name]; ok {
			return g.Limits
		}
		return p.Default
	}
	if l, ok := p.Authorities[key]; ok {
		return l
	}
	return p.Default
}

// WithDefaultFloor returns a copy of p whose default floor is d (the --floor
// flag); per-authority floors are kept. A nil p is the default policy.
func (p *Policy) WithDefaultFloor(d time.Duration) *Policy {
	if p == nil {
		p = DefaultPolicy()
	}
	q := &Policy{Default: p.Default, Authorities: p.Authorities, Groups: p.Groups}
	q.Default.Floor = d
	return q
}

// LoadPolicy reads and validates a policy file (see ParsePolicy).
func LoadPolicy(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

type rawLimits struct {
	Floor       *string `json:"floor"`
	MaxInFlight *int    `json:"max_in_flight"`
	Bandwidth   *string `json:"bandwidth"`
	FirstStep   *string `json:"first_step"`
	Decay       *int    `json:"decay"`
}

type rawPolicy struct {
	Default     *rawLimits            `json:"default"`
	Authorities map[string]*rawLimits `json:"authorities"`
	Groups      map[string]*rawGroup  `json:"groups"`
}

type rawGroup struct {
	Members []string `json:"members"`
	rawLimits
}

// ParsePolicy parses a JSON policy:
//
//	{"default": {"floor": "1s", "max_in_flight": 2},
//	 "authorities": {"files.example.org:443": {"floor": "250ms", "max_in_flight": 4, "bandwidth": "1MiB/s"}},
//	 "groups": {"example": {"members": ["a.example.com:443", "*.example.org"], "floor": "500ms"}}}
//
// first_step (a Go duration above 0, at most 60s) and decay (answers per
// halving below the learned pace, 1 to MaxDecay) tune the convergence after
// a throttling answer (ADR 0029).
// Floors are Go durations ("0", "250ms", "2s"), from 0 to 24h; max_in_flight is
// at least 1; bandwidth is bytes per second ("1MiB/s", "500KB/s", a plain
// number; see CheckBandwidth), "0" for no cap. Omitted fields take the default's value (the default's own
// omitted fields take 1s and 2). Authority keys are "host:port" and are
// normalised (lowercase, IDNA, IPv6 in brackets). Unknown fields are
// rejected. Errors name the offending field.
func ParsePolicy(data []byte) (*Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var raw rawPolicy
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if dec.More() {
		return nil, errors.New("policy: trailing data after the JSON object")
	}
	p := DefaultPolicy()
	var err error
	if p.Default, err = raw.Default.limits(p.Default, "default"); err != nil {
		return nil, err
	}
	if len(raw.Authorities) > 0 {
		p.Authorities = make(map[string]Limits, len(raw.Authorities))
	}
	for key, rl := range raw.Authorities {
		field := fmt.Sprintf("authorities[%q]", key)
		norm, err := NormalizeAuthority(key)
		if err != nil {
			return nil, fmt.Errorf("policy: %s: %w", field, err)
		}
		if _, dup := p.Authorities[norm]; dup {
			return nil, fmt.Errorf("policy: %s: duplicate of authority %q", field, norm)
		}
		l, err := rl.limits(p.Default, field)
		if err != nil {
			return nil, err
		}
		p.Authorities[norm] = l
	}
	if p.Groups, err = parseGroups(raw.Groups, p); err != nil {
		return nil, err
	}
	return p, nil
}

// parseGroups reads a policy file's groups. A group's omitted limits take
// the default's; it needs at least one member; an authority may be named
// by one group only, and not also have limits of its own (they would never
// apply: a member is paced by its group).
func parseGroups(raw map[string]*rawGroup, p *Policy) (map[string]Group, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	out := make(map[string]Group, len(raw))
	named := map[string]string{}
	for name, rg := range raw {
		field := fmt.Sprintf("groups[%q]", name)
		if err := CheckGroupName(name); err != nil {
			return nil, fmt.Errorf("policy: %s: %w", field, err)
		}
		if rg == nil || len(rg.Members) == 0 {
			return nil, fmt.Errorf("policy: %s.members: a group needs at least one member", field)
		}
		g, err := NewGroup(rg.Members)
		if err != nil {
			return nil, fmt.Errorf("policy: %s.%w", field, err)
		}
		for _, m := range g.Members {
			if other, dup := named[m]; dup {
				return nil, fmt.Errorf("policy: %s.members: %s is also a member of group %q", field, m, other)
			}
			named[m] = name
			if _, own := p.Authorities[m]; own {
				return nil, fmt.Errorf("policy: %s.members: %s has limits of its own under authorities; a member is paced by its group's (remove one)", field, m)
			}
		}
		if g.Limits, err = rg.limits(p.Default, field); err != nil {
			return nil, err
		}
		out[name] = g
	}
	return out, nil
}

// NewGroup returns a group of members, normalised (NormalizeMember),
// sorted and without duplicates; its Limits are left for the caller. The
// error names the member that is not valid ("members: ...").
func NewGroup(members []string) (Group, error) {
	seen := map[string]bool{}
	var g Group
	for _, m := range members {
		nm, err := NormalizeMember(m)
		if err != nil {
			return Group{}, fmt.Errorf("members: %w", err)
		}
		if !seen[nm] {
			seen[nm] = true
			g.Members = append(g.Members, nm)
		}
	}
	sort.Strings(g.Members)
	return g, nil
}

func (r *rawLimits) limits(def Limits, field string) (Limits, error) {
	l := def
	if r == nil {
		return l, nil
	}
	if r.Floor != nil {
		d, err := time.ParseDuration(*r.Floor)
		if err != nil {
			return l, fmt.Errorf("policy: %s.floor: %q is not a duration such as \"1s\" or \"250ms\"", field, *r.Floor)
		}
		if d < 0 || d > MaxPolicyFloor {
			return l, fmt.Errorf("policy: %s.floor: %s is outside 0 to %s", field, d, MaxPolicyFloor)
		}
		l.Floor = d
	}
	if r.MaxInFlight != nil {
		n := *r.MaxInFlight
		if n < 1 || n > MaxPolicyInFlight {
			return l, fmt.Errorf("policy: %s.max_in_flight: %d is outside 1 to %d", field, n, MaxPolicyInFlight)
		}
		l.MaxInFlight = n
	}
	if r.Bandwidth != nil {
		n, err := bytesize.ParseRate(*r.Bandwidth)
		if err == nil {
			err = CheckBandwidth(n)
		}
		if err != nil {
			return l, fmt.Errorf("policy: %s.bandwidth: %w", field, err)
		}
		l.Bandwidth = n
	}
	if r.FirstStep != nil {
		d, err := time.ParseDuration(*r.FirstStep)
		if err == nil {
			err = CheckFirstStep(d)
		} else {
			err = fmt.Errorf("%q is not a duration such as \"500ms\"", *r.FirstStep)
		}
		if err != nil {
			return l, fmt.Errorf("policy: %s.first_step: %w", field, err)
		}
		l.FirstStep = d
	}
	if r.Decay != nil {
		if err := CheckDecay(*r.Decay); err != nil {
			return l, fmt.Errorf("policy: %s.decay: %w", field, err)
		}
		l.Decay = *r.Decay
	}
	return l, nil
}

// CheckFirstStep reports a first escalation step outside (0, MaxInterval].
func CheckFirstStep(d time.Duration) error {
	if d <= 0 || d > MaxInterval {
		return fmt.Errorf("%s is outside 0 (excluded) to %s", d, MaxInterval)
	}
	return nil
}

// CheckDecay reports a decay (answers per halving) outside 1 to MaxDecay.
func CheckDecay(n int) error {
	if n < 1 || n > MaxDecay {
		return fmt.Errorf("%d is outside 1 to %d", n, MaxDecay)
	}
	return nil
}

// CheckBandwidth reports a bandwidth cap outside 0 (none) or
// MinPolicyBandwidth and above.
func CheckBandwidth(n int64) error {
	if n < 0 || n > 0 && n < MinPolicyBandwidth {
		return fmt.Errorf("%s is below the lowest cap, %s (0: no cap)", bytesize.FormatRate(n), bytesize.FormatRate(MinPolicyBandwidth))
	}
	return nil
}

// NormalizeAuthority turns a policy key "host:port" into the form Acquire
// receives (authority.Authority.String()); the port is required.
func NormalizeAuthority(key string) (string, error) {
	if _, _, err := net.SplitHostPort(key); err != nil {
		return "", fmt.Errorf("want \"host:port\": %w", err)
	}
	a, err := authority.Parse("http://" + key)
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

// Policy returns the policy in force (the last one SetPolicy gave, else
// Options.Policy). It is read-only.
func (p *Pacer) Policy() *Policy { return p.policy.Load() }

// SetPolicy replaces the policy in force (a live change: package policy
// calls it when an operator edits MIRROR_POLICY). Every tracked authority
// takes its new floor and in-flight cap at once, so the next Acquire and
// every Confirm from now on space requests by the new floor; a slot already
// reserved on the old floor is moved later by Confirm when the floor rose.
// An interval at the old floor moves to the new floor; an escalated
// interval is kept if it is above the new floor (learning from the origin
// is not undone by a policy change), else raised to it. Requests already in
// flight are not recalled: a lowered cap stops new grants until the count
// falls below it, and Confirm revokes reserved slots while the permits held
// outnumber it. A nil p is the default policy. SetPolicy publishes
// nothing.
//
// A change of groups (group.go) also moves state: an authority that joins
// a group brings its cooldown, escalated interval, backoff and latest start
// to the group's pace, one that leaves takes the group's along, and every
// pace whose members changed starts its next request no sooner than
// MoveSettle plus its interval after now. SetPolicy takes now from the
// wall clock; SetPolicyAt takes it from the caller's clock.
func (p *Pacer) SetPolicy(q *Policy) { p.SetPolicyAt(time.Now(), q) }

// SetPolicyAt is SetPolicy at now.
func (p *Pacer) SetPolicyAt(now time.Time, q *Policy) {
	if q == nil {
		q = DefaultPolicy()
	}
	// Stored before the walk: an entry created meanwhile reads q, and one
	// created before the store is reached by the walk, which takes its
	// shard's lock.
	old := p.policy.Swap(q)
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		for auth, e := range s.m {
			l := q.Limits(auth)
			floor := int64(l.Floor)
			if e.interval <= e.floor {
				e.interval = floor
			} else {
				e.interval = max(e.interval, floor)
			}
			e.floor = floor
			e.maxFlight = int32(max(1, min(l.MaxInFlight, MaxPolicyInFlight)))
			e.tuneLocked(l)
		}
		s.mu.Unlock()
	}
	if len(old.Groups) > 0 || len(q.Groups) > 0 {
		p.regroup(now, old, q)
	}
	p.changedNow()
}
