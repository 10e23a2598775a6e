// Package cluster shares the work of several mirrorworker pods through
// partition leases in NATS KV (docs/adr/0007). Each partition of
// MIRROR_JOBS, and so each authority, is served by exactly one pod at a
// time: the one holding its lease in MIRROR_LEASES. Pods announce
// themselves in MIRROR_PODS; each takes about its share of the partitions
// and gives back what is over its share, gracefully, so that the number of
// pods can change under load.
//
// The package decides who owns what; it knows nothing of jobs, HTTP or the
// pacer. What owning a partition means is the Hooks' business (the worker).
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// Hooks are the owner's side of a lease: what to do when a partition is
// acquired or must be given up. The Manager calls them from its own
// goroutine (Release from a goroutine of its own per partition).
type Hooks interface {
	// Acquired starts serving partition p. since is the instant the lease
	// was taken: every request the previous owner started began before it.
	Acquired(ctx context.Context, p int, since time.Time) error
	// Release stops serving p: no request to its authorities may start
	// once it is called (the Manager's Owns already reports false), its
	// held jobs are handed back, and it returns once no request of p is in
	// flight. The lease is given up only after it returns.
	Release(ctx context.Context, p int)
	// Status is this pod's state as JSON, kept in MIRROR_PODS for
	// `mirrorworker status`. It must be small (a few hundred KiB at most).
	Status() []byte
}

// Store is the part of a KV bucket the Manager uses; KV adapts a
// jetstream.KeyValue. Entries expire when not written for the bucket's TTL.
type Store interface {
	// Create writes key only if it has no live entry; it returns the revision.
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	// Update writes key only if its live entry is at revision rev; an error
	// that IsLost reports means the entry expired or another writer won.
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
	// Delete removes key if its entry is at revision rev (0: any).
	Delete(ctx context.Context, key string, rev uint64) error
	Put(ctx context.Context, key string, value []byte) error
	Keys(ctx context.Context) ([]string, error)
}

// ErrLost is what a Store returns (wrapped or not) when an Update finds the
// entry gone or at another revision.
var ErrLost = errors.New("cluster: lease lost")

// KV adapts a jetstream.KeyValue to Store.
type KV struct{ jetstream.KeyValue }

func (k KV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.KeyValue.Create(ctx, key, value)
}

func (k KV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	r, err := k.KeyValue.Update(ctx, key, value, rev)
	if err != nil && (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) || isWrongSequence(err)) {
		return 0, fmt.Errorf("%w: %w", ErrLost, err)
	}
	return r, err
}

func (k KV) Delete(ctx context.Context, key string, rev uint64) error {
	if rev == 0 {
		return k.KeyValue.Delete(ctx, key)
	}
	return k.KeyValue.Delete(ctx, key, jetstream.LastRevision(rev))
}

func (k KV) Put(ctx context.Context, key string, value []byte) error {
	_, err := k.KeyValue.Put(ctx, key, value)
	return err
}

func (k KV) Keys(ctx context.Context) ([]string, error) {
	l, err := k.KeyValue.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for key := range l.Keys() {
		out = append(out, key)
	}
	return out, nil
}

// Options configure a Manager. Zero fields mean the defaults.
type Options struct {
	PodID      string        // required: unique among live pods
	Partitions int           // jobs.DefaultPartitions
	TTL        time.Duration // the leases bucket's TTL; jobs.DefaultLeaseTTL
	Logger     zerolog.Logger
	// ReleaseTimeout bounds how long a graceful release may wait for the
	// partition's requests before Release's context is cancelled; TTL.
	ReleaseTimeout time.Duration
	// Clock measures lease validity (its Now must carry a monotonic
	// reading, as time.Now's does); nil is the real clock.
	Clock clock.Clock
}

// Lease is the value of a partition's key in MIRROR_LEASES.
type Lease struct {
	Pod   string    `json:"pod"`
	Since time.Time `json:"since"`
}

type lease struct {
	rev       uint64
	since     time.Time
	releasing bool
	released  chan struct{}
}

// Manager holds this pod's leases. Owns is safe for concurrent use; Run and
// Close are called once each, in that order.
type Manager struct {
	leases Store
	pods   Store
	h      Hooks
	o      Options
	log    zerolog.Logger
	epoch  time.Time // monotonic base of valid

	// valid[p] is how long after epoch this pod may start requests of p;
	// 0 when it does not own p (or is giving it back).
	valid []atomic.Int64

	mu    sync.Mutex
	owned map[int]*lease

	stopping atomic.Bool // StopTaking: renew and give back, take no more
}

// StopTaking stops taking partitions (the pod is shutting down); leases
// held are still renewed until Close.
func (m *Manager) StopTaking() { m.stopping.Store(true) }

// New returns a Manager using the two buckets (jobs.EnsureWork creates them).
func New(leases, pods Store, h Hooks, o Options) (*Manager, error) {
	if o.PodID == "" {
		return nil, errors.New("cluster: Options.PodID is empty")
	}
	if o.Partitions <= 0 {
		o.Partitions = jobs.DefaultPartitions
	}
	if o.TTL <= 0 {
		o.TTL = jobs.DefaultLeaseTTL
	}
	if o.ReleaseTimeout <= 0 {
		o.ReleaseTimeout = o.TTL
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	return &Manager{
		leases: leases, pods: pods, h: h, o: o, log: o.Logger,
		epoch: o.Clock.Now(),
		valid: make([]atomic.Int64, o.Partitions),
		owned: map[int]*lease{},
	}, nil
}

// Owns reports whether this pod may start a request of partition p now: it
// holds p's lease and renewed it recently enough that the lease cannot have
// expired on the server. The margin is a quarter of the TTL, measured on
// this process's monotonic clock from the moment each renewal was sent, so
// neither clock skew between pods nor a process stopped (SIGSTOP) for longer
// than the TTL can make two pods believe they own p at once.
func (m *Manager) Owns(p int) bool {
	if p < 0 || p >= len(m.valid) {
		return false
	}
	v := m.valid[p].Load()
	return v > 0 && int64(m.o.Clock.Now().Sub(m.epoch)) < v
}

// Owned returns the partitions this pod serves, sorted.
func (m *Manager) Owned() []int {
	var out []int
	for p := range m.valid {
		if m.Owns(p) {
			out = append(out, p)
		}
	}
	return out
}

func (m *Manager) setValid(p int, sent time.Time) {
	m.valid[p].Store(int64(sent.Sub(m.epoch) + m.o.TTL*3/4))
}

// Run takes, renews and gives back leases until ctx ends. It returns nil;
// Close gives the leases up.
func (m *Manager) Run(ctx context.Context) error {
	tick := m.o.TTL / 4
	for {
		m.Step(ctx)
		if !clock.Sleep(m.o.Clock, tick, ctx.Done()) {
			return nil
		}
	}
}

func (m *Manager) leaseValue(since time.Time) []byte {
	b, _ := json.Marshal(Lease{Pod: m.o.PodID, Since: since.UTC()})
	return b
}

// Step is one round of Run: announce this pod, renew its leases, then take
// or give back partitions towards its share. Run calls it every TTL/4;
// simulations call it directly.
func (m *Manager) Step(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, m.o.TTL/2)
	defer cancel()
	if err := m.pods.Put(sctx, m.o.PodID, m.h.Status()); err != nil {
		m.log.Warn().Err(err).Msg("announce pod")
	}
	m.renew(sctx)
	n := m.livePods(sctx)
	if n == 0 {
		return // unknown: change nothing
	}
	target := (m.o.Partitions + n - 1) / n
	m.mu.Lock()
	held := 0
	for _, l := range m.owned {
		if !l.releasing {
			held++
		}
	}
	m.mu.Unlock()
	switch {
	case held > target:
		m.giveBack(ctx, held-target)
	case held < target && !m.stopping.Load():
		m.take(sctx, target-held)
	}
}

func (m *Manager) renew(ctx context.Context) {
	m.mu.Lock()
	ps := make([]int, 0, len(m.owned))
	for p := range m.owned {
		ps = append(ps, p)
	}
	m.mu.Unlock()
	for _, p := range ps {
		m.mu.Lock()
		l := m.owned[p]
		m.mu.Unlock()
		if l.releasing {
			select {
			case <-l.released:
				m.drop(ctx, p, l)
				continue
			default:
			}
		}
		sent := m.o.Clock.Now()
		rev, err := m.leases.Update(ctx, jobs.LeaseKey(p), m.leaseValue(l.since), l.rev)
		switch {
		case err == nil:
			l.rev = rev
			if !l.releasing {
				m.setValid(p, sent)
			}
		case errors.Is(err, ErrLost):
			// Expired on the server (this pod was stopped or cut off for
			// longer than the TTL) and possibly taken by another pod.
			m.log.Warn().Int("partition", p).Err(err).Msg("partition lease lost")
			m.valid[p].Store(0)
			if !l.releasing {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.TTL/4)
				m.h.Release(rctx, p)
				cancel()
			} else {
				<-l.released
			}
			m.mu.Lock()
			delete(m.owned, p)
			m.mu.Unlock()
		default:
			// NATS unreachable: Owns turns false by itself when the lease
			// may have expired; keep trying.
			m.log.Warn().Int("partition", p).Err(err).Msg("renew partition lease")
		}
	}
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// drop gives up a released partition's lease.
func (m *Manager) drop(ctx context.Context, p int, l *lease) {
	if err := m.leases.Delete(ctx, jobs.LeaseKey(p), l.rev); err != nil {
		m.log.Warn().Int("partition", p).Err(err).Msg("give up partition lease (it expires by itself)")
	}
	m.mu.Lock()
	delete(m.owned, p)
	m.mu.Unlock()
	m.log.Info().Int("partition", p).Msg("partition given back")
}

func (m *Manager) livePods(ctx context.Context) int {
	keys, err := m.pods.Keys(ctx)
	if err != nil {
		m.log.Warn().Err(err).Msg("list pods")
		return 0
	}
	n := 0
	self := false
	for _, k := range keys {
		n++
		self = self || k == m.o.PodID
	}
	if !self {
		n++
	}
	return n
}

// giveBack releases n partitions, highest first, in the background: the
// lease is renewed until the worker has handed the partition's jobs back
// and its requests have ended, then deleted (renew sees it released).
func (m *Manager) giveBack(ctx context.Context, n int) {
	m.mu.Lock()
	var ps []int
	for p, l := range m.owned {
		if !l.releasing {
			ps = append(ps, p)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(ps)))
	ps = ps[:min(n, len(ps))]
	for _, p := range ps {
		l := m.owned[p]
		l.releasing = true
		l.released = make(chan struct{})
		m.valid[p].Store(0) // no request of p starts from now on
		go func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.ReleaseTimeout)
			defer cancel()
			m.h.Release(rctx, p)
			close(l.released)
		}()
	}
	m.mu.Unlock()
	if len(ps) > 0 {
		m.log.Info().Ints("partitions", ps).Msg("giving partitions back to balance the pods")
	}
}

// take acquires up to n free partitions, starting at a place that depends
// on the pod id so that pods starting together do not race for the same.
func (m *Manager) take(ctx context.Context, n int) {
	taken := map[string]bool{}
	keys, err := m.leases.Keys(ctx)
	if err != nil {
		m.log.Warn().Err(err).Msg("list leases")
		return
	}
	for _, k := range keys {
		taken[k] = true
	}
	h := fnv.New32a()
	h.Write([]byte(m.o.PodID))
	start := int(h.Sum32() % uint32(m.o.Partitions))
	var got []int
	for i := 0; i < m.o.Partitions && len(got) < n; i++ {
		p := (start + i) % m.o.Partitions
		m.mu.Lock()
		_, mine := m.owned[p]
		m.mu.Unlock()
		if mine || taken[jobs.LeaseKey(p)] {
			continue
		}
		sent := m.o.Clock.Now()
		rev, err := m.leases.Create(ctx, jobs.LeaseKey(p), m.leaseValue(sent))
		if err != nil {
			continue // another pod was quicker
		}
		// Valid before the worker starts pulling, so that the first jobs
		// it receives are served rather than handed back.
		m.setValid(p, sent)
		if err := m.h.Acquired(ctx, p, sent); err != nil {
			m.valid[p].Store(0)
			m.log.Warn().Int("partition", p).Err(err).Msg("serve partition")
			_ = m.leases.Delete(ctx, jobs.LeaseKey(p), rev)
			continue
		}
		m.mu.Lock()
		m.owned[p] = &lease{rev: rev, since: sent}
		m.mu.Unlock()
		got = append(got, p)
	}
	if len(got) > 0 {
		m.log.Info().Ints("partitions", got).Msg("partitions taken")
	}
}

// Close gives up every lease and this pod's entry, so that other pods take
// the partitions at once instead of after the TTL. Call it after the worker
// has stopped (every job handed back, no request in flight).
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	owned := m.owned
	m.owned = map[int]*lease{}
	m.mu.Unlock()
	var errs []error
	for p, l := range owned {
		m.valid[p].Store(0)
		if err := m.leases.Delete(ctx, jobs.LeaseKey(p), l.rev); err != nil {
			errs = append(errs, fmt.Errorf("partition %d: %w", p, err))
		}
	}
	if err := m.pods.Delete(ctx, m.o.PodID, 0); err != nil {
		errs = append(errs, fmt.Errorf("pod entry: %w", err))
	}
	return errors.Join(errs...)
}
