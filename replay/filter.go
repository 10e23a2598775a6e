package replay

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// Filter narrows a replay to some tenants and some authorities. The zero
// Filter selects every job.
type Filter struct {
	// Tenants are tenant tokens; empty means every tenant.
	Tenants []string
	// Authorities are the origins whose jobs to replay; empty means every
	// authority.
	Authorities []authority.Authority
}

// ErrFilter is wrapped by every error about tenants and authorities.
var ErrFilter = errors.New("filter")

// ParseAuthority reads an authority as a user gives it on the command line:
// a URL ("https://files.example.org/pkg/a.tgz": its scheme's default port
// applies) or "host:port" ("files.example.org:443", "[2001:db8::1]:8080").
// A bare host is refused: its port, and so its pacing key, would be a guess.
func ParseAuthority(s string) (authority.Authority, error) {
	if strings.Contains(s, "://") {
		a, err := authority.Parse(s)
		if err != nil {
			return authority.Authority{}, fmt.Errorf("%w: --authority %q: %w", ErrFilter, s, err)
		}
		return a, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || port == "" {
		return authority.Authority{}, fmt.Errorf("%w: --authority %q: give a URL (https://host/...) or host:port", ErrFilter, s)
	}
	// The port is explicit, so the scheme only serves to reuse the URL rules.
	a, err := authority.Parse("http://" + net.JoinHostPort(host, port) + "/")
	if err != nil {
		return authority.Authority{}, fmt.Errorf("%w: --authority %q: %w", ErrFilter, s, err)
	}
	return a, nil
}

// Subjects returns the subject filters of f on MIRROR_JOBS, sorted and
// without duplicates: two per tenant and authority pair (jobs as stored,
// with their partition token, and as an earlier version stored them), "*" standing for
// every tenant or every authority when f names none. The zero Filter gives
// mirror.jobs.>.
//
// Authorities are selected by their subject key, which is not injective
// (see docs/adr/0002): a filter on a.b.example:443 also selects a_b.example:443.
func (f Filter) Subjects() ([]string, error) {
	if len(f.Tenants) == 0 && len(f.Authorities) == 0 {
		return []string{jobs.JobsSubjectPrefix + ">"}, nil
	}
	tenants, err := f.tenants()
	if err != nil {
		return nil, err
	}
	akeys := f.akeys()
	seen := map[string]bool{}
	var out []string
	for _, t := range tenants {
		for _, k := range akeys {
			for _, s := range jobs.JobsSubjectFilters(t, k) {
				if !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

func (f Filter) tenants() ([]string, error) {
	if len(f.Tenants) == 0 {
		return []string{"*"}, nil
	}
	for _, t := range f.Tenants {
		if !jobs.ValidTenant(t) {
			return nil, fmt.Errorf("%w: --tenant %q: a tenant is 1 to %d characters from a-z 0-9 _ -", ErrFilter, t, jobs.MaxTenantLen)
		}
	}
	return f.Tenants, nil
}

func (f Filter) akeys() []string {
	if len(f.Authorities) == 0 {
		return []string{"*"}
	}
	out := make([]string, 0, len(f.Authorities))
	for _, a := range f.Authorities {
		out = append(out, a.Key())
	}
	return out
}
