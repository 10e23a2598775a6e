package fetch

import "time"

// Progress is one fetch in flight as a status shows it: what a long
// download has done so far. The worker fills it in; this package only
// names it, so that the worker's status and the admin endpoint share one
// shape.
type Progress struct {
	URL       string    `json:"url"` // as logged: no userinfo, no query
	Target    string    `json:"target,omitempty"`
	Authority string    `json:"authority"` // host:port of the first hop
	Started   time.Time `json:"started"`   // when the request started
	// Elapsed is the seconds since Started.
	Elapsed float64 `json:"elapsed_seconds"`
	// Bytes is the body bytes received so far; Expected the body's
	// Content-Length (else the job's size), -1 while unknown (no headers
	// yet, or a body of unknown length).
	Bytes    int64 `json:"bytes"`
	Expected int64 `json:"expected_bytes"`
	// Rate is the body's average bytes per second since its headers
	// arrived; 0 before.
	Rate float64 `json:"bytes_per_second"`
}
