// Package grant lets a program other than a pod start requests in the
// cluster's pace (issue 37): it asks the pacer that serves an authority for a
// start over NATS request/reply, gets a start or a wait, and reports the
// answer it got from the origin, so that the pacer learns from it (a 429's
// Retry-After, a rate-limit family, a 5xx) as from its own requests.
//
// It provides the messages and subjects (docs/contract.md, "Grants"), a
// Server that answers them from a *pacer.Pacer, a Client with the one
// loop that waits for a start (Client.Wait), and Paced, a worker's pacer
// whose every start the owner grants (a replay beside pods, docs/adr/0031).
//
// It does not fetch, and it does not decide who serves an authority: a
// Server answers the asks its Options.Owns accepts and stays silent on the
// others, so that with one Server per pod only the owner answers. Every pod
// runs one (pipeline.Pod.Run) on its own pacer, owning the authorities of
// the partitions it serves. Like every package in this module it is not a
// stable public API.
package grant

import (
	"net/http"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
)

// Subjects. An ask goes to AskPrefix + the authority's key
// (authority.KeyOf: "files_example_org_443"), a report to ReportPrefix +
// the same key; both are core NATS request/reply.
const (
	AskPrefix    = "mirror.grant.ask."
	ReportPrefix = "mirror.grant.report."
	// SentPrefix + the key carries a Sent: one-way (core NATS publish, no
	// reply), so that it costs no round trip.
	SentPrefix = "mirror.grant.sent."
)

// AskSubject returns the subject of an ask for auth ("host:port").
func AskSubject(auth string) string { return AskPrefix + authority.KeyOf(auth) }

// ReportSubject returns the subject of a report for auth ("host:port").
func ReportSubject(auth string) string { return ReportPrefix + authority.KeyOf(auth) }

// SentSubject returns the subject of a Sent for auth ("host:port").
func SentSubject(auth string) string { return SentPrefix + authority.KeyOf(auth) }

// Sent says that the request of a grant was written to its connection:
// the owner spaces its next start from when it receives this (pacer.Sent),
// not only from its answer, so that the answer's way to the client and the
// client's way to its socket do not bring the next request closer than the
// floor at the origin.
type Sent struct {
	Grant     string `json:"grant"`
	Authority string `json:"authority"`
}

// Ask asks for a start of one request to Authority ("host:port", as
// authority.Authority.String gives it).
type Ask struct {
	Authority string `json:"authority"`
	// Client names the asker in the server's log.
	Client string `json:"client,omitempty"`
	// Writes says that the asker reports when the granted request is
	// written (Client.Sent): the owner then keeps the next start a spacing
	// after that write, and none starts before it is reported or the
	// grant done, as for the owner's own requests (pacer.Options.AwaitSends).
	// Without it the grant's answer counts as the write.
	Writes bool `json:"writes,omitempty"`
}

// Answer is the server's answer to an Ask: a grant (Grant set: start the
// request now, and report it before Lapses), or a wait (Wait, with the
// pacer's Reason, and Until for a cooldown).
type Answer struct {
	Grant  string    `json:"grant,omitempty"`
	Start  time.Time `json:"start,omitzero"`
	Lapses time.Time `json:"lapses,omitzero"`
	Probe  bool      `json:"probe,omitempty"`

	Wait   time.Duration `json:"wait_ns,omitempty"`
	Reason string        `json:"reason,omitempty"`
	Until  time.Time     `json:"until,omitzero"`
}

// Granted reports whether a is a grant.
func (a Answer) Granted() bool { return a.Grant != "" }

// Report is what became of a granted request: the origin's status and the
// headers the pacer reads (Retry-After, the rate-limit families), or the
// error when no response came, or Cancelled when the request never started.
type Report struct {
	Grant     string      `json:"grant"`
	Authority string      `json:"authority"`
	Status    int         `json:"status,omitempty"`
	Header    http.Header `json:"header,omitempty"`
	Error     string      `json:"error,omitempty"`
	Cancelled bool        `json:"cancelled,omitempty"`
}

// Verdict is the server's reading of a Report (pacer.Verdict), or Unknown
// when the grant had lapsed or was never made.
type Verdict struct {
	Throttled bool      `json:"throttled,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Until     time.Time `json:"until,omitzero"`
	Unknown   bool      `json:"unknown,omitempty"`
}

// DefaultLapse is how long a grant stays valid without a report (the
// default of Options.Lapse): a client that dies after its grant holds the
// authority's in-flight place no longer than this.
const DefaultLapse = 30 * time.Second

// DefaultMaxHold is the longest wait for a slot that the server holds an
// ask for, answering with the grant once the slot comes (the default of
// Options.MaxHold); a longer one is answered as a wait.
const DefaultMaxHold = 2 * time.Second

// ReasonMoved is the Reason of a wait answered when the authority's owner
// changed while the ask was held: ask again after MovedWait, of the new
// owner.
const ReasonMoved = "moved"

// MovedWait is the wait answered with ReasonMoved.
const MovedWait = 100 * time.Millisecond

// ReasonLiveFirst is the Reason of a wait answered while the owner's live
// jobs for the authority go first (Options.Defer).
const ReasonLiveFirst = "live_first"

// Headers returns the headers of h a Report carries: those the pacer can
// read, Retry-After and every rate-limit header (any name with "ratelimit"
// or "rate-limit" in it), whatever family it belongs to.
func Headers(h http.Header) http.Header {
	out := http.Header{}
	for k, v := range h {
		l := strings.ToLower(k)
		if l == "retry-after" || strings.Contains(l, "ratelimit") || strings.Contains(l, "rate-limit") {
			out[k] = v
		}
	}
	return out
}
