package stuborigin

import (
	"errors"
	"fmt"
	"slices"
)

// Faults are the failures the origin injects. The zero value injects none.
// Ratios select a deterministic, evenly spread share of the admitted object
// responses of each authority (not a random draw), so a run is repeatable.
type Faults struct {
	// StoreDown makes the limiter store unreachable: every request is
	// refused with 503 capacity_exhausted and no Retry-After (fail closed).
	StoreDown bool `json:"store_down,omitempty"`
	// ResetRatio of admitted responses are aborted with a TCP reset before
	// any byte of the response is sent.
	ResetRatio float64 `json:"reset_ratio,omitempty"`
	// TruncateRatio of admitted responses announce the full Content-Length
	// but send only half of the body, then close the connection.
	TruncateRatio float64 `json:"truncate_ratio,omitempty"`
	// SlowRatio of admitted responses send the body at SlowBytesPerSecond
	// (default 16 KiB/s).
	SlowRatio          float64 `json:"slow_ratio,omitempty"`
	SlowBytesPerSecond int64   `json:"slow_bytes_per_second,omitempty"`
	// RetryAfter is the format of Retry-After on 429 and 503 answers:
	// "seconds" (default), "http-date", "malformed" or "absent".
	RetryAfter string `json:"retry_after,omitempty"`
	// Authorities limits the faults to these authority indices (0-based);
	// empty means every authority.
	Authorities []int `json:"authorities,omitempty"`
}

// Retry-After formats.
const (
	RetryAfterSeconds   = "seconds"
	RetryAfterHTTPDate  = "http-date"
	RetryAfterMalformed = "malformed"
	RetryAfterAbsent    = "absent"
)

// validate checks f; n is the number of authorities, or -1 when unknown.
func (f Faults) validate(n int) error {
	var errs []error
	for name, r := range map[string]float64{"reset_ratio": f.ResetRatio, "truncate_ratio": f.TruncateRatio, "slow_ratio": f.SlowRatio} {
		if !(r >= 0 && r <= 1) {
			errs = append(errs, fmt.Errorf("%s: must be in [0, 1], got %v", name, r))
		}
	}
	if s := f.ResetRatio + f.TruncateRatio + f.SlowRatio; s > 1 {
		errs = append(errs, fmt.Errorf("reset_ratio + truncate_ratio + slow_ratio: must be at most 1, got %v", s))
	}
	if f.SlowBytesPerSecond < 0 {
		errs = append(errs, errors.New("slow_bytes_per_second: must not be negative"))
	}
	switch f.RetryAfter {
	case "", RetryAfterSeconds, RetryAfterHTTPDate, RetryAfterMalformed, RetryAfterAbsent:
	default:
		errs = append(errs, fmt.Errorf("retry_after: want seconds, http-date, malformed or absent, got %q", f.RetryAfter))
	}
	for _, a := range f.Authorities {
		if a < 0 || (n >= 0 && a >= n) {
			errs = append(errs, fmt.Errorf("authorities: index %d out of range", a))
		}
	}
	return errors.Join(errs...)
}

// appliesTo reports whether f is in force on authority i.
func (f *Faults) appliesTo(i int) bool {
	return len(f.Authorities) == 0 || slices.Contains(f.Authorities, i)
}

func (f *Faults) retryAfterFormat(i int) string {
	if !f.appliesTo(i) || f.RetryAfter == "" {
		return RetryAfterSeconds
	}
	return f.RetryAfter
}

func (f *Faults) slowRate() int64 {
	if f.SlowBytesPerSecond == 0 {
		return 16 << 10
	}
	return f.SlowBytesPerSecond
}

// bodyFault names the fault for the n-th admitted object response.
type bodyFault int

const (
	faultNone bodyFault = iota
	faultReset
	faultTruncate
	faultSlow
)

func (b bodyFault) String() string {
	return [...]string{"none", "reset", "truncate", "slow"}[b]
}

// pick chooses the body fault of the n-th admitted response (n from 1) on
// authority i with a Weyl sequence: over any run of responses the shares
// match the ratios closely, without randomness.
func (f *Faults) pick(i int, n uint64) bodyFault {
	if !f.appliesTo(i) || f.ResetRatio+f.TruncateRatio+f.SlowRatio == 0 {
		return faultNone
	}
	const golden = 0.6180339887498949
	u := float64(n) * golden
	u -= float64(uint64(u))
	switch {
	case u < f.ResetRatio:
		return faultReset
	case u < f.ResetRatio+f.TruncateRatio:
		return faultTruncate
	case u < f.ResetRatio+f.TruncateRatio+f.SlowRatio:
		return faultSlow
	}
	return faultNone
}
