package stuborigin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"
)

// Profile is an origin's admission policy: quotas, the bearer tokens it
// knows, route classes, the shared shard and its fair share, the rate-limit
// header family and the faults in force at start. The format is JSON and is
// documented in README.md. A Profile is read-only once passed to New.
type Profile struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`

	// Quotas by name. "anonymous" is required (callers without a known
	// token); "default" is required when a token names no quota.
	Quotas map[string]Quota `json:"quotas"`
	// Tokens maps a bearer token to the identity it authenticates.
	Tokens map[string]Token `json:"tokens,omitempty"`

	// RouteClasses classify a request path by its longest matching prefix;
	// unmatched paths get DefaultRouteClass ("public-apis" when empty).
	RouteClasses      []RouteClass `json:"route_classes,omitempty"`
	DefaultRouteClass string       `json:"default_route_class,omitempty"`

	// Shard is the shared admission capacity of each authority.
	Shard Shard `json:"shard"`

	// RateLimitHeaders is "none" (or empty), "ietf" or "x-ratelimit".
	RateLimitHeaders string `json:"rate_limit_headers,omitempty"`
	// XRateLimitReset is how X-RateLimit-Reset is written: "delta"
	// (seconds from now, the default) or "epoch" (Unix seconds).
	XRateLimitReset string `json:"x_ratelimit_reset,omitempty"`

	// CapacityErrorBudget is the fraction of requests that may be refused
	// with capacity_exhausted before the alert fires (default 0.01). It is
	// exported as a gauge so that the alert rule reads it from the profile.
	CapacityErrorBudget float64 `json:"capacity_error_budget,omitempty"`

	// AnonymousSalt keys the hash of anonymous identities. Empty: a random
	// salt per Origin, so identity labels cannot be linked across runs.
	AnonymousSalt string `json:"anonymous_salt,omitempty"`

	Objects Objects `json:"objects"`
	// Faults are in force from the start; POST /faults replaces them.
	Faults Faults `json:"faults"`

	// Penalty, when set (After > 0), penalizes an identity that keeps
	// coming early: a ban, a tarpit, a growing Retry-After.
	Penalty *Penalty `json:"penalty,omitempty"`

	// LimitReq or StickTable, when set, admit like a reverse proxy (nginx
	// limit_req, HAProxy's stick-table request rate) instead of Quotas and
	// Shard, and no rate-limit headers are sent. At most one of them.
	LimitReq   *LimitReq   `json:"limit_req,omitempty"`
	StickTable *StickTable `json:"stick_table,omitempty"`
}

// Quota is the pair of token buckets of one identity, evaluated
// independently: a request is admitted only when both hold a token.
type Quota struct {
	Burst     Burst     `json:"burst"`
	Sustained Sustained `json:"sustained"`
}

// Burst is a bucket of Capacity tokens refilled at RefillPerSecond.
type Burst struct {
	Capacity        int64   `json:"capacity"`
	RefillPerSecond float64 `json:"refill_per_second"`
}

// Sustained is a bucket of Capacity tokens refilled evenly over Window, so
// the long-run rate is Capacity/Window.
type Sustained struct {
	Capacity int64    `json:"capacity"`
	Window   Duration `json:"window"`
}

// Token is the identity a bearer token authenticates.
type Token struct {
	Principal string `json:"principal"`
	Tenant    string `json:"tenant"`
	Quota     string `json:"quota,omitempty"` // default "default"
}

// RouteClass names the paths under Prefix.
type RouteClass struct {
	Prefix string `json:"prefix"`
	Class  string `json:"class"`
}

// Shard is the shared admission capacity of one authority: at most Capacity
// admissions per fixed Window, of which one tenant (or one anonymous
// identity) may take at most TenantShare. Capacity 0 disables the shard.
type Shard struct {
	Capacity    int64    `json:"capacity"`
	Window      Duration `json:"window"`
	TenantShare float64  `json:"tenant_share"`
}

// Objects bounds the served objects.
type Objects struct {
	DefaultSize int64 `json:"default_size,omitempty"` // default 1024
	MaxSize     int64 `json:"max_size,omitempty"`     // default 64 MiB
}

// Duration is a time.Duration written in JSON as a Go duration string ("60s").
type Duration struct{ time.Duration }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string such as "1m30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"60s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// Header families.
const (
	HeadersNone       = "none"
	HeadersIETF       = "ietf"
	HeadersXRateLimit = "x-ratelimit"
)

// LoadProfile reads and validates a JSON profile file.
func LoadProfile(path string) (*Profile, error) {
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

// ParseProfile decodes and validates a JSON profile. Unknown fields are
// errors, so that a typo does not silently fall back to a default.
func ParseProfile(b []byte) (*Profile, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Profile
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Validate reports every problem in p, each prefixed with its field path.
func (p *Profile) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if p.LimitReq != nil && p.StickTable != nil {
		bad("limit_req", "limit_req and stick_table exclude each other")
	}
	if p.ProxyLimited() {
		// A reverse proxy's limiter: no quotas needed, and none of what
		// only the quotas drive (headers, the shard).
		if p.RateLimitHeaders != "" && p.RateLimitHeaders != HeadersNone {
			bad("rate_limit_headers", "must be none with limit_req or stick_table (the proxies send none)")
		}
		if p.Shard.Capacity != 0 {
			bad("shard", "must be absent with limit_req or stick_table")
		}
		if err := p.LimitReq.validate(); err != nil {
			errs = append(errs, err)
		}
		if err := p.StickTable.validate(); err != nil {
			errs = append(errs, err)
		}
	} else if len(p.Quotas) == 0 {
		bad("quotas", "required (at least \"anonymous\")")
	}
	if _, ok := p.Quotas["anonymous"]; !ok && len(p.Quotas) > 0 {
		bad("quotas.anonymous", "required: the quota of callers without a known token")
	}
	for _, name := range sortedKeys(p.Quotas) {
		q := p.Quotas[name]
		f := "quotas." + name
		if q.Burst.Capacity < 1 || q.Burst.Capacity > 1e9 {
			bad(f+".burst.capacity", "must be between 1 and 1e9, got %d", q.Burst.Capacity)
		}
		if !(q.Burst.RefillPerSecond > 0) || q.Burst.RefillPerSecond > 1e9 || math.IsInf(q.Burst.RefillPerSecond, 0) {
			bad(f+".burst.refill_per_second", "must be above 0 and at most 1e9, got %v", q.Burst.RefillPerSecond)
		} else if q.Burst.Capacity >= 1 && float64(q.Burst.Capacity)/q.Burst.RefillPerSecond > 366*24*3600 {
			bad(f+".burst", "capacity/refill_per_second must be at most a year")
		}
		if q.Sustained.Capacity < 1 || q.Sustained.Capacity > 1e9 {
			bad(f+".sustained.capacity", "must be between 1 and 1e9, got %d", q.Sustained.Capacity)
		}
		if q.Sustained.Window.Duration <= 0 || q.Sustained.Window.Duration > 366*24*time.Hour {
			bad(f+".sustained.window", "must be above 0 and at most 366 days, got %v", q.Sustained.Window.Duration)
		} else if q.Sustained.Capacity >= 1 && q.Sustained.Window.Duration/time.Duration(q.Sustained.Capacity) <= 0 {
			bad(f+".sustained", "window/capacity is below 1ns")
		}
	}
	for _, tok := range sortedKeys(p.Tokens) {
		t := p.Tokens[tok]
		// The token itself never appears in an error: it is a credential.
		f := fmt.Sprintf("tokens[principal %q]", t.Principal)
		if tok == "" || strings.ContainsAny(tok, " \t\r\n,") {
			bad(f, "token must be non-empty without spaces or commas")
		}
		if t.Principal == "" {
			bad(f+".principal", "required")
		}
		if t.Tenant == "" {
			bad(f+".tenant", "required")
		}
		qn := t.Quota
		if qn == "" {
			qn = "default"
		}
		if _, ok := p.Quotas[qn]; !ok {
			bad(f+".quota", "names quota %q, which is not defined", qn)
		}
	}
	for i, rc := range p.RouteClasses {
		f := fmt.Sprintf("route_classes[%d]", i)
		if !strings.HasPrefix(rc.Prefix, "/") {
			bad(f+".prefix", "must start with /")
		}
		if rc.Class == "" {
			bad(f+".class", "required")
		}
	}
	if s := p.Shard; s.Capacity < 0 {
		bad("shard.capacity", "must be 0 (no shard) or positive")
	} else if s.Capacity > 0 {
		if s.Window.Duration <= 0 {
			bad("shard.window", "must be above 0 when shard.capacity is set")
		}
		if !(s.TenantShare > 0 && s.TenantShare <= 1) {
			bad("shard.tenant_share", "must be in (0, 1], got %v", s.TenantShare)
		}
	}
	switch p.RateLimitHeaders {
	case "", HeadersNone, HeadersIETF, HeadersXRateLimit:
	default:
		bad("rate_limit_headers", "want %q, %q or %q, got %q", HeadersNone, HeadersIETF, HeadersXRateLimit, p.RateLimitHeaders)
	}
	switch p.XRateLimitReset {
	case "", "delta", "epoch":
	default:
		bad("x_ratelimit_reset", "want \"delta\" or \"epoch\", got %q", p.XRateLimitReset)
	}
	if p.CapacityErrorBudget < 0 || p.CapacityErrorBudget > 1 {
		bad("capacity_error_budget", "must be in [0, 1]")
	}
	if p.Objects.DefaultSize < 0 {
		bad("objects.default_size", "must not be negative")
	}
	if p.Objects.MaxSize < 0 {
		bad("objects.max_size", "must not be negative")
	}
	if err := p.Penalty.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := p.Faults.validate(-1); err != nil {
		errs = append(errs, fmt.Errorf("faults: %w", err))
	}
	return errors.Join(errs...)
}

// SustainedRate is the long-run admissions per second that quota q allows
// one identity on one authority, the shard's tenant share included; 0 when q
// is not defined. The load test sums it over identities and authorities.
func (p *Profile) SustainedRate(q string) float64 {
	switch {
	case p.LimitReq != nil:
		return p.LimitReq.Rate
	case p.StickTable != nil:
		return float64(p.StickTable.Limit) / p.StickTable.Period.Seconds()
	}
	qq, ok := p.Quotas[q]
	if !ok {
		return 0
	}
	r := float64(qq.Sustained.Capacity) / qq.Sustained.Window.Seconds()
	if s := p.Shard; s.Capacity > 0 {
		share := float64(tenantSlots(s)) / s.Window.Seconds()
		r = math.Min(r, share)
	}
	return r
}

func (p *Profile) headers() string {
	if p.RateLimitHeaders == "" {
		return HeadersNone
	}
	return p.RateLimitHeaders
}

func (p *Profile) errorBudget() float64 {
	if p.CapacityErrorBudget == 0 {
		return 0.01
	}
	return p.CapacityErrorBudget
}

func (p *Profile) defaultSize() int64 {
	if p.Objects.DefaultSize == 0 {
		return 1024
	}
	return p.Objects.DefaultSize
}

func (p *Profile) maxSize() int64 {
	if p.Objects.MaxSize == 0 {
		return 64 << 20
	}
	return p.Objects.MaxSize
}

func (p *Profile) routeClass(path string) string {
	best, cls := -1, p.DefaultRouteClass
	for _, rc := range p.RouteClasses {
		if strings.HasPrefix(path, rc.Prefix) && len(rc.Prefix) > best {
			best, cls = len(rc.Prefix), rc.Class
		}
	}
	if cls == "" {
		cls = "public-apis"
	}
	return cls
}

// tenantSlots is how many shard admissions one tenant may take per window.
func tenantSlots(s Shard) int64 {
	n := int64(math.Floor(float64(s.Capacity) * s.TenantShare))
	if n < 1 {
		n = 1
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
