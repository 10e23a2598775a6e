// Package policy is the live politeness policy: floors, in-flight caps and
// bandwidth caps an operator changes on a running cluster, kept in the NATS KV bucket
// MIRROR_POLICY (one key per authority, and a default), watched by every
// pod and merged over the static policy (--policy FILE, --floor,
// --max-in-flight) into the pacer's policy.
//
// It provides the bucket's keys and values (Key, ParseKey, Value), the
// merge and its precedence (Merge), and the Watcher, which loads the
// bucket before a pod starts, follows every change, re-watches with
// backoff when the watch is lost, and ends a temporary override at its
// Until on its own clock (a KV TTL is not relied on: with History > 1 the
// server raises a per-key TTL to the bucket's marker TTL).
//
// It does not pace requests (package pacer does, with the merged policy)
// nor parse the static policy file (pacer.ParsePolicy does).
package policy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/bytesize"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// Bucket is the KV bucket of the live policy.
const Bucket = "MIRROR_POLICY"

// DefaultKey is the key of the default: the limits of every authority that
// has no key of its own and no entry in the static policy file.
const DefaultKey = "default"

// Key prefixes: a host of letters, digits, dots and dashes is kept legible
// ("auth.files.example.org.443"); any other (an IPv6 address) is base64url.
const (
	authPrefix  = "auth."
	b64Prefix   = "authx."
	groupPrefix = "group." // a politeness group: group.NAME (pacer.GroupPrefix + NAME in Merge's map)
)

// ErrInvalid is wrapped by every error about a malformed key or value.
var ErrInvalid = errors.New("invalid policy")

// Key returns the bucket key of auth ("host:port" or a URL's authority, as
// the policy file accepts it), or DefaultKey for "default".
//
// A group is named "group:NAME" (pacer.GroupPrefix); its key is
// "group.NAME".
func Key(auth string) (string, error) {
	if auth == DefaultKey {
		return DefaultKey, nil
	}
	if name, ok := strings.CutPrefix(auth, pacer.GroupPrefix); ok {
		if err := pacer.CheckGroupName(name); err != nil {
			return "", fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return groupPrefix + name, nil
	}
	norm, err := pacer.NormalizeAuthority(auth)
	if err != nil {
		return "", fmt.Errorf("%w: authority %q: %w", ErrInvalid, auth, err)
	}
	host, port := authority.Split(norm)
	if legible(host) {
		return authPrefix + host + "." + port, nil
	}
	return b64Prefix + base64.RawURLEncoding.EncodeToString([]byte(norm)), nil
}

// ParseKey returns the authority ("host:port") or group ("group:NAME") a
// bucket key names, or DefaultKey.
func ParseKey(key string) (string, error) {
	switch {
	case key == DefaultKey:
		return DefaultKey, nil
	case strings.HasPrefix(key, authPrefix):
		rest := key[len(authPrefix):]
		i := strings.LastIndexByte(rest, '.')
		if i <= 0 || i == len(rest)-1 {
			return "", fmt.Errorf("%w: key %q: want auth.HOST.PORT", ErrInvalid, key)
		}
		return canonical(key, rest[:i]+":"+rest[i+1:])
	case strings.HasPrefix(key, groupPrefix):
		name := key[len(groupPrefix):]
		if err := pacer.CheckGroupName(name); err != nil {
			return "", fmt.Errorf("%w: key %q: %w", ErrInvalid, key, err)
		}
		return pacer.GroupPrefix + name, nil
	case strings.HasPrefix(key, b64Prefix):
		b, err := base64.RawURLEncoding.DecodeString(key[len(b64Prefix):])
		if err != nil {
			return "", fmt.Errorf("%w: key %q: %w", ErrInvalid, key, err)
		}
		return canonical(key, string(b))
	}
	return "", fmt.Errorf("%w: key %q: want %q, auth.HOST.PORT, authx.BASE64 or group.NAME", ErrInvalid, key, DefaultKey)
}

// canonical checks that auth is normalised and that key is its Key, so that
// one authority has exactly one key.
func canonical(key, auth string) (string, error) {
	norm, err := pacer.NormalizeAuthority(auth)
	if err != nil {
		return "", fmt.Errorf("%w: key %q: %w", ErrInvalid, key, err)
	}
	if k, err := Key(norm); err != nil || k != key {
		return "", fmt.Errorf("%w: key %q: not the key of %s (%s)", ErrInvalid, key, norm, k)
	}
	return norm, nil
}

func legible(host string) bool {
	if host == "" || host[0] == '.' || host[len(host)-1] == '.' {
		return false
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// Value is one key's limits. A nil field is not set: the authority keeps
// what it would have without this key (see Merge). A Value with an Until
// applies only before Until.
type Value struct {
	Floor       *time.Duration
	MaxInFlight *int
	Bandwidth   *int64 // bytes per second over all the authority's bodies in flight; 0: no cap
	// FirstStep and Decay tune the convergence after a throttling answer
	// (pacer.Limits.FirstStep and Decay, ADR 0029).
	FirstStep *time.Duration
	Decay     *int
	// Members are a group's authorities and domain patterns (a group's key
	// only; pacer.NewGroup normalises them). A group's value without
	// members keeps those of the group in the policy file.
	Members []string
	Until   time.Time // zero: no end
	Reason  string    // why, for the logs and status
	SetAt   time.Time // when it was written (by `mirrorworker policy set`)
}

type rawValue struct {
	Floor       *string    `json:"floor,omitempty"`
	MaxInFlight *int       `json:"max_in_flight,omitempty"`
	Bandwidth   *string    `json:"bandwidth,omitempty"`
	FirstStep   *string    `json:"first_step,omitempty"`
	Decay       *int       `json:"decay,omitempty"`
	Members     []string   `json:"members,omitempty"`
	Until       *time.Time `json:"until,omitempty"`
	Reason      string     `json:"reason,omitempty"`
	SetAt       *time.Time `json:"set_at,omitempty"`
}

// MarshalJSON writes {"floor": "300ms", "max_in_flight": 2, "bandwidth":
// "1MiB/s", "first_step": "500ms", "decay": 700, "until": RFC 3339,
// "reason": "...", "set_at": RFC 3339}, the unset fields left out.
func (v Value) MarshalJSON() ([]byte, error) {
	var r rawValue
	if v.Floor != nil {
		s := v.Floor.String()
		r.Floor = &s
	}
	r.MaxInFlight, r.Reason, r.Members = v.MaxInFlight, v.Reason, v.Members
	if v.Bandwidth != nil {
		s := bytesize.FormatRate(*v.Bandwidth)
		r.Bandwidth = &s
	}
	if v.FirstStep != nil {
		s := v.FirstStep.String()
		r.FirstStep = &s
	}
	r.Decay = v.Decay
	if !v.Until.IsZero() {
		u := v.Until.UTC()
		r.Until = &u
	}
	if !v.SetAt.IsZero() {
		a := v.SetAt.UTC()
		r.SetAt = &a
	}
	return json.Marshal(r)
}

// ParseValue reads and validates a bucket value: unknown fields are
// rejected, a floor is a Go duration from 0 to pacer.MaxPolicyFloor,
// max_in_flight is 1 to pacer.MaxPolicyInFlight, bandwidth is bytes per
// second ("1MiB/s", a plain number; 0 or pacer.MinPolicyBandwidth and up),
// first_step a Go duration above 0 up to pacer.MaxInterval, decay 1 to
// pacer.MaxDecay, and one of them (or a group's members) at least is set.
// Errors name the field.
func ParseValue(data []byte) (Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var r rawValue
	if err := dec.Decode(&r); err != nil {
		return Value{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if dec.More() {
		return Value{}, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalid)
	}
	v := Value{MaxInFlight: r.MaxInFlight, Decay: r.Decay, Reason: r.Reason, Members: r.Members}
	if r.FirstStep != nil {
		d, err := time.ParseDuration(*r.FirstStep)
		if err != nil {
			return Value{}, fmt.Errorf("%w: first_step: %q is not a duration such as \"500ms\"", ErrInvalid, *r.FirstStep)
		}
		v.FirstStep = &d
	}
	if r.Floor != nil {
		d, err := time.ParseDuration(*r.Floor)
		if err != nil {
			return Value{}, fmt.Errorf("%w: floor: %q is not a duration such as \"1s\" or \"250ms\"", ErrInvalid, *r.Floor)
		}
		v.Floor = &d
	}
	if r.Bandwidth != nil {
		n, err := bytesize.ParseRate(*r.Bandwidth)
		if err != nil {
			return Value{}, fmt.Errorf("%w: bandwidth: %q is not a rate such as \"1MiB/s\" or \"500KB/s\"", ErrInvalid, *r.Bandwidth)
		}
		v.Bandwidth = &n
	}
	if r.Until != nil {
		v.Until = *r.Until
	}
	if r.SetAt != nil {
		v.SetAt = *r.SetAt
	}
	return v, v.Validate()
}

// Validate checks the limits' ranges (see ParseValue).
func (v Value) Validate() error {
	if v.Floor == nil && v.MaxInFlight == nil && v.Bandwidth == nil && v.FirstStep == nil && v.Decay == nil && len(v.Members) == 0 {
		return fmt.Errorf("%w: none of floor, max_in_flight, bandwidth, first_step, decay and members is set", ErrInvalid)
	}
	if v.FirstStep != nil {
		if err := pacer.CheckFirstStep(*v.FirstStep); err != nil {
			return fmt.Errorf("%w: first_step: %w", ErrInvalid, err)
		}
	}
	if v.Decay != nil {
		if err := pacer.CheckDecay(*v.Decay); err != nil {
			return fmt.Errorf("%w: decay: %w", ErrInvalid, err)
		}
	}
	if len(v.Members) > 0 {
		if _, err := pacer.NewGroup(v.Members); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	if v.Floor != nil && (*v.Floor < 0 || *v.Floor > pacer.MaxPolicyFloor) {
		return fmt.Errorf("%w: floor: %s is outside 0 to %s", ErrInvalid, *v.Floor, pacer.MaxPolicyFloor)
	}
	if v.MaxInFlight != nil && (*v.MaxInFlight < 1 || *v.MaxInFlight > pacer.MaxPolicyInFlight) {
		return fmt.Errorf("%w: max_in_flight: %d is outside 1 to %d", ErrInvalid, *v.MaxInFlight, pacer.MaxPolicyInFlight)
	}
	if v.Bandwidth != nil {
		if err := pacer.CheckBandwidth(*v.Bandwidth); err != nil {
			return fmt.Errorf("%w: bandwidth: %w", ErrInvalid, err)
		}
	}
	return nil
}

// CheckKeyValue reports a value that does not fit its key (as ParseKey
// returns it): members belong to a group's key only.
func CheckKeyValue(key string, v Value) error {
	if len(v.Members) > 0 && !strings.HasPrefix(key, pacer.GroupPrefix) {
		return fmt.Errorf("%w: members: only a group (group:NAME) has members, not %s", ErrInvalid, key)
	}
	return nil
}

// Active reports whether v is in force at now (it has no Until, or now is
// before it).
func (v Value) Active(now time.Time) bool { return v.Until.IsZero() || now.Before(v.Until) }

// over returns l with v's set fields.
func (v Value) over(l pacer.Limits) pacer.Limits {
	if v.Floor != nil {
		l.Floor = *v.Floor
	}
	if v.MaxInFlight != nil {
		l.MaxInFlight = *v.MaxInFlight
	}
	if v.Bandwidth != nil {
		l.Bandwidth = *v.Bandwidth
	}
	if v.FirstStep != nil {
		l.FirstStep = *v.FirstStep
	}
	if v.Decay != nil {
		l.Decay = *v.Decay
	}
	return l
}

// Sources of pacer.Limits.Source, as status and /debug/pacer show them.
const (
	SourceStatic  = "static"     // --floor/--max-in-flight, or the --policy file's default
	SourceFile    = "file"       // the authority's entry in the --policy file
	SourceDefault = "kv:default" // the bucket's default key
	SourceKV      = "kv"         // the authority's own key in the bucket
)

// Merge is the policy in force at now: base (the static policy: --policy
// FILE with --floor and --max-in-flight; nil is the defaults) under the
// bucket's values, keyed by authority ("host:port") or DefaultKey. The
// precedence is by specificity first, then by source:
//
//  1. the authority's own key in the bucket;
//  2. the authority's entry in the policy file;
//  3. the bucket's default key;
//  4. the static default (the file's default, --floor, --max-in-flight).
//
// A value's unset fields come from the level below it (an authority's key
// that sets only a floor keeps the cap of its file entry, or else of the
// defaults). Values past their Until are left out. next is the earliest
// Until still ahead, when the result changes by itself; zero if none.
func Merge(base *pacer.Policy, vals map[string]Value, now time.Time) (p *pacer.Policy, next time.Time) {
	if base == nil {
		base = pacer.DefaultPolicy()
	}
	later := func(v Value) {
		if !v.Until.IsZero() && v.Until.After(now) && (next.IsZero() || v.Until.Before(next)) {
			next = v.Until
		}
	}
	def := base.Default
	def.Source = SourceStatic
	if v, ok := vals[DefaultKey]; ok && v.Active(now) {
		def = v.over(def)
		def.Source = SourceDefault
		later(v)
	}
	p = &pacer.Policy{Default: def, Authorities: make(map[string]pacer.Limits, len(base.Authorities)+len(vals))}
	for a, l := range base.Authorities {
		l.Source = SourceFile
		p.Authorities[a] = l
	}
	p.Groups = mergeGroups(base.Groups, vals, def, now, later)
	for a, v := range vals {
		if a == DefaultKey || strings.HasPrefix(a, pacer.GroupPrefix) || !v.Active(now) {
			continue
		}
		under, ok := p.Authorities[a]
		if !ok {
			under = def
		}
		l := v.over(under)
		l.Source = SourceKV
		p.Authorities[a] = l
		later(v)
	}
	return p, next
}

// mergeGroups is Merge's part for politeness groups: the file's groups,
// each overridden (limits, and members when the value gives them) by its
// group.NAME key in the bucket; a group key for a group the file does not
// have makes a new one, under the default def. A group left without
// members is not a group. A value's members that do not validate leave
// the group as it was (the command validates before writing).
func mergeGroups(file map[string]pacer.Group, vals map[string]Value, def pacer.Limits, now time.Time, later func(Value)) map[string]pacer.Group {
	out := make(map[string]pacer.Group, len(file))
	for name, g := range file {
		g.Limits.Source = SourceFile
		out[name] = g
	}
	for key, v := range vals {
		name, ok := strings.CutPrefix(key, pacer.GroupPrefix)
		if !ok || !v.Active(now) {
			continue
		}
		g, had := out[name]
		under := def
		if had {
			under = g.Limits
		}
		if len(v.Members) > 0 {
			if ng, err := pacer.NewGroup(v.Members); err == nil {
				g.Members = ng.Members
			}
		}
		if len(g.Members) == 0 {
			continue
		}
		g.Limits = v.over(under)
		g.Limits.Source = SourceKV
		out[name] = g
		later(v)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
