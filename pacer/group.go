package pacer

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
)

// Politeness groups (docs/adr/0026). A group puts several authorities into
// one pace: one floor, one in-flight cap, one cooldown, one probe, one
// failure backoff, as one origin serving many virtual hosts sees it. The
// pacer keys its state by an authority's pace key: the group's key
// ("group:NAME") for a member, the authority itself otherwise. The
// partition of a member's jobs follows the pace key too (worker), so that
// one pod owns the group.

// GroupPrefix starts a group's pace key: "group:NAME". No authority starts
// with it (an authority's port is a number, a group's name starts with a
// letter), so the two kinds of key never meet.
const GroupPrefix = "group:"

// Group is one politeness group: its members and its limits.
type Group struct {
	// Members are normalised "host:port" authorities and domain patterns:
	// "*.example.org" (every host under example.org, any port) or
	// "*.example.org:443" (those hosts on port 443 only). A pattern does
	// not match the domain itself: list "example.org:443" for it.
	Members []string
	Limits  Limits
}

var groupNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// CheckGroupName reports whether name may name a group: a lower-case
// letter, then up to 62 letters, digits and dashes.
func CheckGroupName(name string) error {
	if !groupNameRE.MatchString(name) {
		return fmt.Errorf("group name %q: want a lower-case letter, then letters, digits and dashes (at most 63)", name)
	}
	return nil
}

// NormalizeMember returns a group member in the form the pacer matches:
// an authority as NormalizeAuthority gives it, or a pattern "*.DOMAIN" or
// "*.DOMAIN:PORT" with the domain normalised like a host.
func NormalizeMember(m string) (string, error) {
	rest, ok := strings.CutPrefix(m, "*.")
	if !ok {
		if strings.Contains(m, "*") {
			return "", fmt.Errorf("member %q: a pattern starts with \"*.\" (\"*.example.org\" or \"*.example.org:443\")", m)
		}
		a, err := NormalizeAuthority(m)
		if err != nil {
			return "", fmt.Errorf("member %q: %w", m, err)
		}
		return a, nil
	}
	host, port := rest, ""
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		host, port = rest[:i], rest[i+1:]
	}
	probe := host + ":" + port
	if port == "" {
		probe = host + ":1"
	}
	if host == "" || strings.Contains(host, "*") {
		return "", fmt.Errorf("member %q: want \"*.DOMAIN\" or \"*.DOMAIN:PORT\"", m)
	}
	a, err := NormalizeAuthority(probe)
	if err != nil {
		return "", fmt.Errorf("member %q: %w", m, err)
	}
	h, p := authority.Split(a)
	if net.ParseIP(strings.Trim(h, "[]")) != nil {
		return "", fmt.Errorf("member %q: a pattern names a domain, not an address", m)
	}
	if port == "" {
		return "*." + h, nil
	}
	return "*." + h + ":" + p, nil
}

// GroupOf returns the group an authority ("host:port", normalised) belongs
// to, or "" when it belongs to none. An authority listed by name beats a
// pattern; among patterns the longest domain wins, then one with a port;
// among equals, the group whose name sorts first.
func (p *Policy) GroupOf(auth string) string {
	if p == nil || len(p.Groups) == 0 || strings.HasPrefix(auth, GroupPrefix) {
		return ""
	}
	host, port := authority.Split(auth)
	best, bestLen, bestPort, exact := "", -1, false, false
	for name, g := range p.Groups {
		for _, m := range g.Members {
			if m == auth {
				if !exact || name < best {
					best, exact = name, true
				}
				continue
			}
			if exact {
				continue
			}
			d, ok := strings.CutPrefix(m, "*.")
			if !ok {
				continue
			}
			mp := ""
			if i := strings.LastIndexByte(d, ':'); i >= 0 {
				d, mp = d[:i], d[i+1:]
			}
			if mp != "" && mp != port || !strings.HasSuffix(host, "."+d) {
				continue
			}
			switch l := len(d); {
			case l > bestLen, l == bestLen && mp != "" && !bestPort, l == bestLen && (mp != "") == bestPort && name < best:
				best, bestLen, bestPort = name, l, mp != ""
			}
		}
	}
	return best
}

// PaceKey returns the key the pacer keeps auth's state under: "group:NAME"
// for a member of a group, auth itself otherwise (a group's key is its own
// pace key). The worker partitions jobs by it.
func (p *Policy) PaceKey(auth string) string {
	if g := p.GroupOf(auth); g != "" {
		return GroupPrefix + g
	}
	return auth
}

// GroupNames returns the groups' names, sorted.
func (p *Policy) GroupNames() []string {
	if p == nil {
		return nil
	}
	out := make([]string, 0, len(p.Groups))
	for n := range p.Groups {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// PaceKey is the pace key of auth under the policy in force (see
// Policy.PaceKey).
func (p *Pacer) PaceKey(auth string) string { return p.policy.Load().PaceKey(auth) }

// regroup is SetPolicy's part for groups, run with no lock held after
// the new policy is stored: every pace whose members changed is fenced
// (MoveSettle), and the state of an authority or group that moves is
// carried to its new pace, so that a cooldown, an escalated interval or a
// backoff is not left behind by a policy change.
func (p *Pacer) regroup(now time.Time, old, q *Policy) {
	n := now.UnixNano()
	at := settledAt(n)
	fence := map[string]bool{}
	// Groups that are new or whose members changed.
	for name, g := range q.Groups {
		if og, ok := old.Groups[name]; !ok || !slices.Equal(og.Members, g.Members) {
			fence[GroupPrefix+name] = true
		}
	}
	// Groups that changed or went: a member named in the old definition
	// that leaves takes the group's state along even if this pod never
	// served it through the group (it may know the group's cooldown from
	// another pod's fact); one matched by a pattern takes it along if it
	// was served (e.members below), or else when its first request is
	// paced on its own (departedLocked).
	type move struct{ from, to string }
	var moves []move
	var changed []string
	for name, og := range old.Groups {
		if g, ok := q.Groups[name]; ok && slices.Equal(og.Members, g.Members) {
			continue
		}
		k := GroupPrefix + name
		changed = append(changed, k)
		for _, m := range og.Members {
			if strings.HasPrefix(m, "*.") {
				continue
			}
			if to := q.PaceKey(m); to != k {
				moves = append(moves, move{k, to})
			}
		}
	}
	// Tracked state that moves: an authority's own entry that is now a
	// member, and the members a group entry served that are no longer in it.
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			if !strings.HasPrefix(k, GroupPrefix) {
				switch was, to := old.PaceKey(k), q.PaceKey(k); {
				case to == was:
				case to != k:
					moves = append(moves, move{k, to}) // it joined a group, or changed groups
				default:
					fence[k] = true // it left a group: its old pace may have just started it
				}
				continue
			}
			for m := range e.members {
				if to := q.PaceKey(m); to != k {
					moves = append(moves, move{k, to})
					delete(e.members, m)
				}
			}
		}
		s.mu.Unlock()
	}
	for _, mv := range moves {
		p.carry(n, mv.from, mv.to)
		fence[mv.to] = true
	}
	// What the changed groups leave to members matched by a pattern that
	// this pod has no entry for (departedLocked).
	left := &departed{old: old, at: at, groups: map[string]entry{}}
	for _, k := range changed {
		s := p.shardFor(k)
		s.mu.Lock()
		if e := s.m[k]; e != nil {
			left.groups[k] = timingOf(e)
		} else {
			left.groups[k] = entry{} // its members' new paces are fenced all the same
		}
		s.mu.Unlock()
	}
	if len(left.groups) > 0 {
		p.left.Store(left)
	}
	for k := range fence {
		s := p.shardFor(k)
		s.mu.Lock()
		e := p.entryLocked(s, k, n)
		fenceLocked(e, at)
		s.mu.Unlock()
	}
}

// carry makes the pace to as polite as the pace from says: the latest
// start, a cooldown, an escalated interval, a backoff and a pause are
// carried over (each only ever made stricter). No lock may be held.
func (p *Pacer) carry(n int64, from, to string) {
	if from == to {
		return
	}
	s := p.shardFor(from)
	s.mu.Lock()
	e := s.m[from]
	if e == nil {
		s.mu.Unlock()
		return
	}
	src := timingOf(e)
	s.mu.Unlock()
	s = p.shardFor(to)
	s.mu.Lock()
	defer s.mu.Unlock()
	p.mergeLocked(p.entryLocked(s, to, n), &src)
}

// timingOf is a copy of e's timing, without what belongs to e alone.
func timingOf(e *entry) entry {
	src := *e
	src.members, src.bud, src.rule = nil, nil, nil
	src.escSeq = 0 // a permit number of e's shard, which another's are not
	return src
}

// mergeLocked makes d as polite as src (carry). d's lock must be held.
func (p *Pacer) mergeLocked(d, src *entry) {
	d.lastStart = max(d.lastStart, src.lastStart)
	d.started = max(d.started, src.started)
	d.startedOther = max(d.startedOther, src.started)
	if src.until > d.until {
		d.until, d.ceiling = src.until, max(d.ceiling, src.ceiling)
	}
	if src.interval > d.interval {
		d.interval, d.decayRef = min(src.interval, max(p.maxInterval, d.floor)), max(d.decayRef, src.decayRef)
		d.pubIv = d.interval
	}
	// The slower learned pace and the later escalation (ADR 0029): an
	// answer to a request sent before either does not escalate again.
	d.pace = max(d.pace, src.pace)
	if src.escAt > d.escAt {
		d.escAt, d.answered = src.escAt, src.answered
		d.escSeq = 0 // src's shard numbers its permits apart from d's
		d.resumed, d.answeredOn = src.resumed, src.answeredOn
		if src.rd != nil {
			rd := *src.rd
			rd.open = 0 // its answer comes to the old pace's entry
			d.rd = &rd
		}
	}
	if src.failUntil > d.failUntil {
		d.failUntil, d.fails, d.failAt = src.failUntil, max(d.fails, src.fails), max(d.failAt, src.failAt)
	}
	if src.paused > d.paused {
		d.paused, d.pauseReason = src.paused, src.pauseReason
	}
	d.pausedAt = max(d.pausedAt, src.pausedAt)
	d.lastThrot = max(d.lastThrot, src.lastThrot)
}

// departed is what a policy change that changed groups left for members
// matched by a pattern, which no pod can list: the previous policy, the
// instant of the change, and the timing each changed group had then. An
// authority whose entry is created after the change (its first request
// under its new pace) and whose pace under the previous policy was one of
// those groups starts from that group's timing, fenced like the other
// moved paces (regroup).
type departed struct {
	old    *Policy
	at     int64 // the change plus MoveSettle
	groups map[string]entry
}

// departedLocked gives a new entry of key what its previous group left
// (departed), if key left a group that changed, while any of it can still
// matter at n (the fence, a cooldown, a backoff or a pause not yet over).
// s.mu is held, and no other lock is taken.
func (p *Pacer) departedLocked(e *entry, key string, n int64) {
	d := p.left.Load()
	if d == nil || strings.HasPrefix(key, GroupPrefix) {
		return
	}
	g := d.old.PaceKey(key)
	if g == key || p.policy.Load().PaceKey(key) == g {
		return
	}
	src, ok := d.groups[g]
	if !ok || n >= max(d.at, src.until, src.failUntil, src.paused)+max(src.interval, e.floor) {
		return
	}
	p.mergeLocked(e, &src)
	fenceLocked(e, d.at)
}

// noteMemberLocked records that auth was served through the group entry e,
// so that a later policy change that takes auth out of the group carries
// the group's state to auth's new pace.
func noteMemberLocked(e *entry, key, auth string) {
	if key == auth {
		return
	}
	if e.members == nil {
		e.members = map[string]struct{}{}
	}
	if _, ok := e.members[auth]; !ok {
		e.members[strings.Clone(auth)] = struct{}{}
	}
}
