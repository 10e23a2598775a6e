package worker

import (
	"encoding/json"
	"sort"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// PodStatus is one pod's view of the authorities it serves, as kept in
// MIRROR_PODS and shown by `mirrorworker status`.
type PodStatus struct {
	Pod         string            `json:"pod"`
	Version     string            `json:"version,omitempty"`
	Updated     time.Time         `json:"updated"`
	Partitions  []int             `json:"partitions"`
	Held        int               `json:"held"`
	Authorities []AuthorityStatus `json:"authorities"`
	// Truncated is how many authorities were left out (see MaxStatusAuthorities).
	Truncated int `json:"truncated,omitempty"`
	// Requests are the requests this pod started in the last minute, by
	// class (live, replay).
	Requests ClassRequests `json:"requests_last_minute"`
	// AllowPrivateNetworks: the pod fetches loopback and private addresses
	// (run's --allow-private-networks), which enqueue would otherwise warn
	// it refuses. Set by the pod (package pipeline), not by Status.
	AllowPrivateNetworks bool `json:"allow_private_networks,omitempty"`
	// Fetches are the fetches in flight, the longest running first: URL,
	// bytes so far of expected, rate (see MaxStatusFetches).
	Fetches []fetch.Progress `json:"fetches,omitempty"`
	// Deletes is the pod's delete limit: its value, the deletes of the
	// last minute, and since when it holds deletes back (delete.go).
	Deletes DeleteStatus `json:"deletes"`
	// Copied is how many jobs the pod stored by a copy within the target
	// (the same bytes under another key), with no request, since it started.
	Copied int64 `json:"copied,omitempty"`
}

// MaxStatusFetches bounds the fetches in flight of one PodStatus, the
// longest running kept: a pod with hundreds of slots still writes an
// entry of a few KiB.
const MaxStatusFetches = 50

// AuthorityStatus is one authority in a PodStatus.
type AuthorityStatus struct {
	pacer.State
	Queued int   `json:"queued"`
	Parked int64 `json:"parked"`
}

// MaxStatusAuthorities bounds the authorities of one PodStatus: the busiest
// (most jobs waiting), then the ones cooling, paused or escalated.
const MaxStatusAuthorities = 500

// Status returns this worker's PodStatus: every authority that is not idle
// or has jobs waiting, in memory or parked. A politeness group is one row
// ("group:NAME", the pacer's state), counting its members' jobs.
func (w *Worker) Status(pod, version string, partitions []int, states []pacer.State) PodStatus {
	queued := byPaceKey(w.sched.queuedByAuth(), w.d.Pacer.PaceKey)
	parked := byPaceKey(w.Parked(), w.d.Pacer.PaceKey)
	now := w.clk.Now()
	st := PodStatus{Pod: pod, Version: version, Updated: now.UTC(), Partitions: partitions, Held: w.sched.held(), Requests: w.classes.lastMinute(now)}
	seen := map[string]bool{}
	for _, s := range states {
		seen[s.Authority] = true
		if s.State == pacer.StateIdle && queued[s.Authority] == 0 && parked[s.Authority] == 0 {
			continue
		}
		st.Authorities = append(st.Authorities, AuthorityStatus{State: s, Queued: queued[s.Authority], Parked: parked[s.Authority]})
	}
	for a, n := range parked {
		if !seen[a] {
			st.Authorities = append(st.Authorities, AuthorityStatus{State: pacer.State{Authority: a, State: pacer.StateIdle}, Queued: queued[a], Parked: n})
		}
	}
	sort.Slice(st.Authorities, func(i, j int) bool {
		a, b := st.Authorities[i], st.Authorities[j]
		if wa, wb := int64(a.Queued)+a.Parked, int64(b.Queued)+b.Parked; wa != wb {
			return wa > wb
		}
		return a.Authority < b.Authority
	})
	st.Deletes = w.deletes.status(now)
	st.Copied = w.Copied()
	st.Fetches = w.Fetches(now)
	if len(st.Fetches) > MaxStatusFetches {
		st.Fetches = st.Fetches[:MaxStatusFetches]
	}
	if len(st.Authorities) > MaxStatusAuthorities {
		st.Truncated = len(st.Authorities) - MaxStatusAuthorities
		st.Authorities = st.Authorities[:MaxStatusAuthorities]
	}
	return st
}

// StatusJSON is Status encoded, for cluster.Hooks.Status.
func (w *Worker) StatusJSON(pod, version string, partitions []int, states []pacer.State) []byte {
	b, _ := json.Marshal(w.Status(pod, version, partitions, states))
	return b
}

// byPaceKey adds up counts by authority into counts by pace key.
func byPaceKey[N int | int64](m map[string]N, key func(string) string) map[string]N {
	out := make(map[string]N, len(m))
	for a, n := range m {
		out[key(a)] += n
	}
	return out
}

// Fetches returns the fetches in flight at now, the longest running
// first: URL, bytes so far of expected, rate, elapsed.
func (w *Worker) Fetches(now time.Time) []fetch.Progress {
	return w.transfers.snapshot(now)
}

// Copied returns how many jobs this worker stored by a copy within the
// target, with no request to their origin, since it started.
func (w *Worker) Copied() int64 { return w.copies.n.Load() }
