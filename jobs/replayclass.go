package jobs

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
)

// A replay beside live pods does not fetch: it hands its jobs to the pods
// that own their authorities (docs/adr/0025). Each is a copy of the
// submitted job in MIRROR_JOBS, on the job's own subject (so in its
// authority's partition), marked with the headers below: the replay class.
// A pod queues it behind the authority's live jobs, stores it into the
// replay's target, and reports its end on ReplayDoneSubject.
const (
	// HeaderReplay names the replay run a copy belongs to (a token, see
	// ValidReplayRun). Replay skips such copies (IsCopy).
	HeaderReplay = "Mirror-Replay"
	// HeaderReplayTarget is the mirror target the copy is stored into, as
	// the replay canonicalized it (file:///abs/dir or s3://BUCKET/PREFIX):
	// a pod stores it there only when that target is its own or one its
	// operator allowed (run --replay-target).
	HeaderReplayTarget = "Mirror-Replay-Target"
	// HeaderReplayOf is the MIRROR_JOBS sequence of the submitted job the
	// copy replays, for the replay to match the pods' reports to its own
	// consumer's messages.
	HeaderReplayOf = "Mirror-Replay-Of"

	// ReplayDonePrefix + <run> is the core NATS subject a pod reports each
	// replay job's end on (ReplayDone). Core, not JetStream: a report lost
	// leaves the replay's message unacked, it is delivered again after its
	// AckWait and handed over again, and the pod answers from what it
	// stored (a conditional request).
	ReplayDonePrefix = "mirror.replay.done."

	// ReplaysBucket holds one entry per replay run that hands its jobs to
	// the pods, refreshed while it runs (ReplayRun). A pod drops the copies
	// of a run that has no entry: an interrupted replay leaves nothing
	// queued as live work once its entry is deleted (Ctrl-C) or has
	// expired (SIGKILL, after ReplaysTTL).
	ReplaysBucket = "MIRROR_REPLAYS"
	ReplaysTTL    = 10 * time.Second

	// ReplayDLQStream holds the dead letters of replays, wherever the work
	// ran (docs/adr/0021): subjects ReplayDLQPrefix<tenant>.<akey>.
	ReplayDLQStream = "MIRROR_REPLAY_DLQ"
	ReplayDLQPrefix = "mirror.replay.dlq."
)

// ReplayHeaders are the headers that make a MIRROR_JOBS message a replay
// copy; a copy of it (parked and brought back, a redirect's continuation)
// keeps them.
var ReplayHeaders = []string{HeaderReplay, HeaderReplayTarget, HeaderReplayOf}

// CopyReplayHeaders sets on to every replay header of from.
func CopyReplayHeaders(to, from nats.Header) {
	for _, k := range ReplayHeaders {
		if v := from.Get(k); v != "" {
			to.Set(k, v)
		}
	}
}

// ValidReplayRun reports whether s can name a replay run: one subject
// token of the characters a key may hold.
func ValidReplayRun(s string) bool { return len(s) <= 64 && tokenChars(s) }

// ReplayDoneSubject returns ReplayDonePrefix + run.
func ReplayDoneSubject(run string) string { return ReplayDonePrefix + run }

// ReplayDone is a pod's report that it finished a replay job: stored,
// unchanged (a 304 against what the target holds), or dead-lettered (into
// ReplayDLQStream), or dropped (its run was over).
type ReplayDone struct {
	Of        uint64 `json:"of"` // HeaderReplayOf
	JobID     string `json:"job_id"`
	Authority string `json:"authority"`
	Outcome   string `json:"outcome"`
	Reason    string `json:"reason,omitempty"`
	Pod       string `json:"pod"`
}

// ReplayRun is a replay's entry in ReplaysBucket: what `mirrorworker
// status` shows of it and what the pods check its copies against.
type ReplayRun struct {
	Run     string    `json:"run"`
	Target  string    `json:"target"`
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
	// Jobs is how many jobs the replay has to do, Done how many are
	// finished and Waiting how many are in the pods' queues now.
	Jobs    int64 `json:"jobs"`
	Done    int64 `json:"done"`
	Waiting int64 `json:"waiting"`
	// ETA is the replay's estimate of the time left, from its pace so far.
	ETA time.Duration `json:"eta,omitempty"`
	// Authorities are the per-authority counts, busiest first.
	Authorities []ReplayAuthority `json:"authorities,omitempty"`

	// A replay that found no live pod paces its own requests (docs/adr/0025):
	// Alone says it does now. A pod that starts meanwhile announces itself
	// and then waits (at most a bound) until no entry says Alone before it
	// takes work; the replay, seeing the pod, stops starting requests,
	// lets those in flight end, and hands the rest over. AloneUntil is when
	// its last own request had ended, and LastStarts are its last request
	// starts per authority (the recent ones): a pod spaces its first
	// requests to those authorities from them (pacer.Fence).
	Alone      bool                 `json:"alone,omitempty"`
	AloneUntil time.Time            `json:"alone_until,omitzero"`
	LastStarts map[string]time.Time `json:"last_starts,omitempty"`
	// Ended is when a replay that paced alone ended without handing over:
	// its entry is left to expire (ReplaysTTL) rather than deleted, so
	// that a pod starting just after it still finds its LastStarts.
	// `mirrorworker status` does not list such an entry.
	Ended time.Time `json:"ended,omitzero"`
	// Replays that find no pod pace one at a time: Order is the revision
	// of the entry's first version in ReplaysBucket (0 in that version,
	// which is read by its own revision). A replay waits, its entry still
	// Alone, until no entry of lower order paces alone; WaitingFor names
	// the one it waits for, empty once it paces.
	Order      uint64 `json:"order,omitempty"`
	WaitingFor string `json:"waiting_for,omitempty"`
	// PodsGone is set on a replay that ran beside pods and paces alone
	// again because they have all gone: since when no pod ran (none
	// announced, no partition leased) and none answered its asks
	// (docs/adr/0031). Cleared when it goes back to the pods' pace.
	PodsGone time.Time `json:"pods_gone,omitzero"`
}

// ReplayAuthority is one authority of a ReplayRun.
type ReplayAuthority struct {
	Authority string `json:"authority"`
	Done      int64  `json:"done"`
	Waiting   int64  `json:"waiting"` // in the pods' queues
	Held      int64  `json:"held"`    // delivered to the replay, not yet handed over
}

// Encode is r as JSON.
func (r ReplayRun) Encode() []byte { b, _ := json.Marshal(r); return b }

// LastStartsOf are the LastStarts of runs, one set per run, in the form the
// pacer's fence takes them (pacer.Pacer.FenceAll): the hand-over from
// replays that paced alone.
func LastStartsOf(runs []ReplayRun) []map[string]time.Time {
	out := make([]map[string]time.Time, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.LastStarts)
	}
	return out
}
