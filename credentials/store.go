package credentials

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
)

// DefaultReloadInterval is how often Run re-reads the files (Options.ReloadInterval).
// A Kubernetes Secret update reaches the pod's volume within about a
// minute; this adds at most 10 s.
const DefaultReloadInterval = 10 * time.Second

// Options configure a Store. A nil *Options, and every zero field, means
// the default given on the field.
type Options struct {
	ReloadInterval time.Duration // DefaultReloadInterval
	Clock          clock.Clock   // clock.Real
	Logger         zerolog.Logger
	// Registerer gets mirrorworker_credentials_entries and
	// mirrorworker_credentials_stale; nil registers nothing.
	Registerer prometheus.Registerer
}

// Store is the current credential set of a path, reloaded by Reload and
// Run. It is a fetch.CredentialSource. Safe for concurrent use.
type Store struct {
	path string
	o    Options
	cur  atomic.Pointer[Set]

	entries prometheus.Gauge
	stale   prometheus.Gauge

	// mu serialises reloads and guards the fields below it.
	mu       sync.Mutex
	version  uint64 // the last version given to an entry
	lastErr  string
	onChange []func(changed func(authority.Authority) bool)
}

var _ fetch.CredentialSource = (*Store)(nil)

// Open loads path (see Load); an error here is the caller's to report, as
// there is no good set to keep yet.
func Open(path string, o *Options) (*Store, error) {
	s := &Store{path: path}
	if o != nil {
		s.o = *o
	}
	if s.o.ReloadInterval <= 0 {
		s.o.ReloadInterval = DefaultReloadInterval
	}
	if s.o.Clock == nil {
		s.o.Clock = clock.Real{}
	}
	set, err := Load(path)
	if err != nil {
		return nil, err
	}
	s.stamp(set, nil)
	s.cur.Store(set)
	s.entries = prometheus.NewGauge(prometheus.GaugeOpts{Name: "mirrorworker_credentials_entries",
		Help: "authorities (and wildcards) of the credential set in use"})
	s.stale = prometheus.NewGauge(prometheus.GaugeOpts{Name: "mirrorworker_credentials_stale",
		Help: "1 while the credential files do not parse and the last good set is kept"})
	if s.o.Registerer != nil {
		for _, c := range []prometheus.Collector{s.entries, s.stale} {
			if err := s.o.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	s.entries.Set(float64(set.Len()))
	s.o.Logger.Info().Str("path", path).Strs("authorities", set.Patterns()).Msg("credentials loaded")
	return s, nil
}

// Credential returns a's credential in the current set, or nil.
func (s *Store) Credential(a authority.Authority) *fetch.Credential {
	return s.cur.Load().Credential(a)
}

// Set returns the current set.
func (s *Store) Set() *Set { return s.cur.Load() }

// OnChange adds f, called after every reload that changed, added or
// removed an entry, with a matcher of the authorities whose credential
// changed. f must not block.
func (s *Store) OnChange(f func(changed func(authority.Authority) bool)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onChange = append(s.onChange, f)
}

// Reload re-reads the files. A set that does not load leaves the current
// one in force; the error is logged once per distinct error (and returned)
// and mirrorworker_credentials_stale is 1 until a reload succeeds.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, err := Load(s.path)
	if err != nil {
		s.stale.Set(1)
		if msg := err.Error(); msg != s.lastErr {
			s.lastErr = msg
			s.o.Logger.Error().Err(err).Str("path", s.path).
				Msg("credentials do not load: keeping the last good set until they are fixed")
		}
		return err
	}
	if s.lastErr != "" {
		s.o.Logger.Info().Str("path", s.path).Msg("credentials load again")
		s.lastErr = ""
	}
	s.stale.Set(0)
	old := s.cur.Load()
	changed := s.stamp(set, old)
	if len(changed) == 0 {
		return nil // nothing new: keep the old set and its pointers
	}
	s.cur.Store(set)
	s.entries.Set(float64(set.Len()))
	s.o.Logger.Info().Str("path", s.path).Strs("changed", changed).Int("authorities", set.Len()).Msg("credentials reloaded")
	match := func(a authority.Authority) bool { return old.lookup(a) != set.lookup(a) }
	for _, f := range s.onChange {
		f(match)
	}
	return nil
}

// stamp gives each entry of set its version: an entry whose material is
// that of old's entry of the same pattern is replaced by old's (same
// version, same *fetch.Credential, so pooled connections stay), any other
// gets a new version. It returns the patterns added, changed or removed.
// s.mu must be held (or s unpublished).
func (s *Store) stamp(set, old *Set) (changed []string) {
	prev := map[string]*entry{}
	if old != nil {
		for _, e := range old.exact {
			prev[e.pattern] = e
		}
		for _, e := range old.wild {
			prev[e.pattern] = e
		}
	}
	fix := func(e *entry) *entry {
		if p := prev[e.pattern]; p != nil {
			delete(prev, e.pattern)
			if p.digest == e.digest {
				return p
			}
		}
		s.version++
		e.cred.Version = s.version
		changed = append(changed, e.pattern)
		return e
	}
	for a, e := range set.exact {
		set.exact[a] = fix(e)
	}
	for i, e := range set.wild {
		set.wild[i] = fix(e)
	}
	for p := range prev {
		changed = append(changed, p)
	}
	sort.Strings(changed)
	return changed
}

// Run reloads every ReloadInterval until ctx ends; it returns nil then.
func (s *Store) Run(ctx context.Context) error {
	for clock.Sleep(s.o.Clock, s.o.ReloadInterval, ctx.Done()) {
		_ = s.Reload() // logged by Reload; the last good set stays
	}
	return nil
}
