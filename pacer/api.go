package pacer

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// This file holds the types other packages program against (the worker, the
// admin endpoint, replay). Fields may be added; existing ones keep their meaning.

// Reason says why Acquire refused a request.
type Reason string

const (
	ReasonCooling  Reason = "cooling"  // a cooldown is in force
	ReasonProbing  Reason = "probing"  // the cooldown is over and a probe is in flight
	ReasonInFlight Reason = "inflight" // the authority's in-flight cap is reached
	ReasonSpacing  Reason = "spacing"  // the next slot is further away than maxWait
	ReasonPaused   Reason = "paused"   // an operator paused the authority
	ReasonBackoff  Reason = "backoff"  // the authority is failing and backed off (backoff.go)
)

// Permit is a granted request start. The caller must not start the request
// before Start, must call Pacer.Confirm immediately before starting it (which
// may move Start later), and must call Done exactly once with the Permit
// Confirm last returned.
type Permit struct {
	Authority string        // "host:port"
	Start     time.Time     // when the request may start (a reserved slot may be in the future)
	Probe     bool          // this request is the probe after a cooldown
	Interval  time.Duration // the spacing in force when granted
	seq       uint64        // identifies the grant; zero for a Permit not made by Acquire
	key       string        // the pace key it was granted under (group.go); "" is Authority
}

// paceKey is the key of the entry that granted pm.
func (pm Permit) paceKey() string {
	if pm.key != "" {
		return pm.key
	}
	return pm.Authority
}

// RefusedError is Acquire's refusal. The job that asked is deferred, never
// failed.
type RefusedError struct {
	Authority string
	Reason    Reason
	// Wait is how long until the authority could plausibly take a request:
	// the rest of a cooldown, 1 s while a probe runs, the gap to the next slot.
	Wait time.Duration
	// Interval is the spacing in force, so a caller deferring many jobs can
	// spread them over the slots the authority can actually serve.
	Interval time.Duration
	// Until is the cooldown deadline when Reason is ReasonCooling.
	Until time.Time
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("pacer: %s %s, retry in %s", e.Authority, e.Reason, e.Wait)
}

// Response is what the caller observed for a granted request.
type Response struct {
	Status    int         // HTTP status; 0 when no response arrived
	Header    http.Header // response headers (may be nil)
	Err       error       // network or protocol error; Status is then 0
	Cancelled bool        // the request never started or was abandoned by the caller
	// URL is what the request asked for, so that one URL's failures are
	// told from the origin's (the worker gives the job's URL for every
	// hop); "" means unknown: every failure is then the origin's.
	URL string
}

// Verdict is the pacer's reading of a Response.
type Verdict struct {
	// Throttled: the response is the origin refusing for rate reasons (429,
	// 503 with a valid positive Retry-After or read as a limiter's refusal,
	// 403 with an exhausted rate-limit family). The job is deferred, not
	// failed.
	Throttled bool
	// Reason is a stable code for metrics and logs, e.g. "429", "503",
	// "limiter" (a 503 read as a limiter's refusal), "ratelimit" (an
	// exhausted family), "403"; empty when nothing was learned.
	Reason string
	// Until is the cooldown deadline in force after this response; zero if none.
	Until time.Time
}

// EventType names a pacer fact published to MIRROR_EVENTS.
type EventType string

const (
	EventThrottle  EventType = "throttle"  // a throttling signal was received
	EventCooldown  EventType = "cooldown"  // a cooldown was entered or extended
	EventRecovered EventType = "recovered" // a probe succeeded; the cooldown is cleared
	EventInterval  EventType = "interval"  // the interval changed (escalation or decay)
	// EventPaused and EventResumed are an operator's manual pause of an
	// authority (mirrorworker pause/resume); the pacer never emits them, it
	// only applies them. A pause is not capped and is no throttling signal:
	// it neither escalates nor wants a probe when it ends.
	EventPaused  EventType = "paused"
	EventResumed EventType = "resumed"
	// EventCapped: a response asked for a pause longer than MaxPause while
	// a longer cooldown was already in force, so nothing changed but the
	// request is worth a warning. It is for logs only: the worker's
	// facts.Sink does not publish it, and Apply ignores it.
	EventCapped EventType = "capped"
	// EventBackoff: a failure (no answer, or a 5xx without a valid
	// Retry-After) backed the authority off until Until; Failures is the
	// count of consecutive ones. EventBackoffEnded: the origin answered
	// again, the backoff is over. Neither is a throttling signal: they
	// change no interval and no cooldown.
	EventBackoff      EventType = "backoff"
	EventBackoffEnded EventType = "backoff_ended"
)

// Event is a pacer fact. Replaying events (Apply) rebuilds the state that
// matters for politeness after a cold start.
type Event struct {
	Type      EventType     `json:"type"`
	Authority string        `json:"authority"`
	At        time.Time     `json:"at"`
	Status    int           `json:"status,omitempty"`
	Reason    string        `json:"reason,omitempty"`
	Interval  time.Duration `json:"interval,omitempty"`
	Until     time.Time     `json:"until,omitzero"`
	Ceiling   time.Duration `json:"ceiling,omitempty"`  // fallback ceiling after this fact
	Failures  int           `json:"failures,omitempty"` // consecutive failures (EventBackoff)

	// What a pause was made of (EventCooldown, EventCapped), for the log
	// line; not published.
	Pause    time.Duration `json:"-"` // the pause taken, after the cap
	Asked    time.Duration `json:"-"` // the pause asked for, when MaxPause capped it
	Fallback bool          `json:"-"` // the pause is the jittered fallback
	Family   string        `json:"-"` // the rate-limit family whose reset gave the pause
	Extended bool          `json:"-"` // the cooldown was already in force
	// AfterBlastStep: a limiter's refusal (EventThrottle, reason
	// "limiter") read as such only because it answered the request sent
	// after the cold blast's short step (docs/adr/0030); for the log line.
	AfterBlastStep bool `json:"-"`
}

// State is one tracked authority as /debug/pacer shows it.
type State struct {
	Authority     string        `json:"authority"`
	State         string        `json:"state"` // "idle", "active", "escalated", "cooling", "probing", "paused", "backoff"
	Floor         time.Duration `json:"floor_ns"`
	Interval      time.Duration `json:"interval_ns"`
	NextSlot      time.Time     `json:"next_slot"`
	CooldownUntil time.Time     `json:"cooldown_until,omitzero"`
	Ceiling       time.Duration `json:"fallback_ceiling_ns"`
	Probing       bool          `json:"probing"`
	InFlight      int           `json:"in_flight"`
	MaxInFlight   int           `json:"max_in_flight"`
	LastThrottle  time.Time     `json:"last_throttle,omitzero"`
	PausedUntil   time.Time     `json:"paused_until,omitzero"` // an operator's pause
	// PauseReason is the --reason of the operator's pause in force.
	PauseReason string `json:"pause_reason,omitempty"`
	// Failures counts consecutive failures; BackoffUntil is when the
	// failure backoff ends (zero: none in force).
	Failures     int       `json:"failures,omitempty"`
	BackoffUntil time.Time `json:"backoff_until,omitzero"`
	// PolicySource says where Floor and MaxInFlight come from (Limits.Source):
	// empty for a Pacer built from a static policy alone.
	PolicySource string `json:"policy_source,omitempty"`
	// Bandwidth is the authority's bandwidth cap in bytes per second
	// (Limits.Bandwidth; 0: none), which package bandwidth enforces.
	Bandwidth int64 `json:"bandwidth,omitempty"`
	// FirstStep and Decay are the convergence settings in force
	// (Limits.FirstStep and Limits.Decay, or the defaults: FirstStep is
	// then the step from the learned pace once there is one, as a
	// refusal without a cooldown would take it); Pace is the
	// spacing learned from the origin's admissions, zero when none (ADR
	// 0029).
	FirstStep Duration `json:"first_step,omitempty"`
	Decay     int      `json:"decay,omitempty"`
	Pace      Duration `json:"pace,omitempty"`
}

// Duration is a time.Duration that JSON writes as Go writes a duration
// ("1.5s"), for the fields an operator reads.
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a string such as "1.5s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a string such as "1.5s" (or a number of
// nanoseconds).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("duration: %w", err)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}
