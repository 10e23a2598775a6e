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
	// Acquired starts serving partition p. since is the take-over's fence
	// instant (takeOverFence), which the owner gives the pacer's one fence
	// for each of p's authorities: the instant the lease was taken (every
	// request the previous owner started began before it), or
	// Options.ExpiredHold later when the previous owner's lease expired
	// instead of being given back, so that what it learned and could not
	// yet publish can still arrive first (docs/adr/0007).
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
	// Create writes key only if it has no live entry; it returns the
	// revision, and whether the key's last entry was a deletion (a lease
	// given back) rather than none at all (expired, or never written).
	Create(ctx context.Context, key string, value []byte) (rev uint64, deleted bool, err error)
	// Update writes key only if its live entry is at revision rev; an error
	// that IsLost reports means the entry expired or another writer won.
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
	// Delete removes key if its entry is at revision rev (0: any).
	Delete(ctx context.Context, key string, rev uint64) error
	// Put writes key whatever its entry; it returns the revision.
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	Keys(ctx context.Context) ([]string, error)
}

// ErrLost is what a Store returns (wrapped or not) when an Update finds the
// entry gone or at another revision.
var ErrLost = errors.New("cluster: lease lost")

// KV adapts a jetstream.KeyValue to Store.
type KV struct{ jetstream.KeyValue }

// Create first writes key on the condition that the bucket holds no entry
// for it at all (an expired lease or one never taken: MaxAge has removed
// every entry); when that fails, it creates it over a deletion marker (a
// lease given back), which fails if the key is live.
func (k KV) Create(ctx context.Context, key string, value []byte) (uint64, bool, error) {
	rev, err := k.KeyValue.Update(ctx, key, value, 0)
	if err == nil {
		return rev, false, nil
	}
	if !isWrongSequence(err) && !errors.Is(err, jetstream.ErrKeyExists) {
		return 0, false, err
	}
	rev, err = k.KeyValue.Create(ctx, key, value)
	return rev, err == nil, err
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

func (k KV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.KeyValue.Put(ctx, key, value)
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
	// OpTimeout bounds each store operation of a lease round: every
	// renewal, the announce, each listing and each take has a deadline of
	// its own. Zero means TTL/2, the longest round trip at which renewals
	// sent every TTL/4 still keep a lease valid without a gap.
	OpTimeout time.Duration
	// ExpiredHold is how long a pod that takes over a partition whose
	// lease it saw held, and which expired rather than being given back,
	// holds the first request to each of its authorities (Hooks.Acquired's
	// since): the previous owner may have learned a wait in its last
	// validity that it could not publish, and publishes it once its link
	// works again. Zero means DefaultExpiredHold(TTL); negative, no hold.
	ExpiredHold time.Duration
	// Link reports whether this pod's connection to the store is up
	// (nats.Conn.IsConnected, or broker.Link, which reads it without the
	// connection's lock); nil means always. While it reports false,
	// Owns is false for every partition: a pod whose NATS connection is
	// known to be down starts no request, whatever validity its leases
	// have left, because what it learns can reach no other pod.
	Link func() bool
	// Clock measures lease validity (its Now must carry a monotonic
	// reading, as time.Now's does); nil is the real clock.
	Clock clock.Clock
}

// DefaultExpiredHold is Options.ExpiredHold's default: two TTLs. A take-over
// of an expired lease comes about a TTL after the previous owner's link
// failed, so a wait that owner learned and publishes once its link works
// again binds the new owner if the link is back within about three TTLs
// (18 s with the default TTL); the price is that a killed pod's
// partitions wait two TTLs more for their first request (docs/adr/0007).
func DefaultExpiredHold(ttl time.Duration) time.Duration { return 2 * ttl }

// Lease is the value of a partition's key in MIRROR_LEASES.
type Lease struct {
	Pod   string    `json:"pod"`
	Since time.Time `json:"since"`
}

// lease is a partition this pod holds or is letting go of. Its fields are
// guarded by the Manager's mu, except since (fixed) and released, which
// only its release goroutine closes.
type lease struct {
	rev       uint64
	since     time.Time
	lastOK    time.Time // when the last successful renewal (or the take) was sent
	releasing bool
	lost      bool // no longer this pod's: released, never renewed or deleted
	released  chan struct{}
}

// round is what the last balance round found, for Serving.
type round struct {
	pods  int // live pods, this one included
	free  int // partitions no pod held at the listing (less those it took)
	share int // Share(partitions, pods)
}

// Manager holds this pod's leases. Owns, Owned and Serving are safe for
// concurrent use; Run (or Step) and Close are called once each, in that
// order (Step repeatedly, from one goroutine).
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
	last  atomic.Pointer[round]

	mu    sync.Mutex
	owned map[int]*lease
	// podRev is the revision of this pod's MIRROR_PODS entry, 0 when it
	// has none it knows of; the balance loop's only.
	podRev uint64
	// heldElsewhere is when a successful listing last found each lease key
	// held by another pod; the balance loop's only. A partition taken that
	// another pod held lately (within heldRecently), and whose key has no
	// deletion marker, expired. Not only the listing just before: a lease
	// seen expired in one round may be taken in a later one.
	heldElsewhere map[string]time.Time

	// The last renewal round's and balance round's failure (nil: every
	// operation reached the store in time). While either is set the pod
	// withdraws its entry instead of announcing itself, takes nothing, and
	// is not serving.
	renewErr, balanceErr error

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
	if o.OpTimeout <= 0 {
		o.OpTimeout = o.TTL / 2
	}
	if o.ExpiredHold == 0 {
		o.ExpiredHold = DefaultExpiredHold(o.TTL)
	}
	o.ExpiredHold = max(o.ExpiredHold, 0)
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
// expired on the server, and its link to NATS is not known to be down. The
// margin is a quarter of the TTL, measured on this process's monotonic
// clock from the moment each renewal was sent, so neither clock skew
// between pods nor a process stopped (SIGSTOP) for longer than the TTL can
// make two pods believe they own p at once.
func (m *Manager) Owns(p int) bool {
	if p < 0 || p >= len(m.valid) {
		return false
	}
	v := m.valid[p].Load()
	if v <= 0 || int64(m.o.Clock.Now().Sub(m.epoch)) >= v {
		return false
	}
	return m.o.Link == nil || m.o.Link()
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

// Share is how many partitions a pod must hold to serve its share when n
// live pods share p partitions: what is left to it when each of the others
// holds the ⌈p/n⌉ a pod moves towards, and at most ⌊p/n⌋. It is 0 when
// there are more pods than the others leave work for (stand-by).
func Share(p, n int) int {
	if n <= 1 {
		return p
	}
	target := (p + n - 1) / n
	return max(0, min(p/n, p-(n-1)*target))
}

// Serving reports why this pod is not serving its share of the work, or
// nil when it is: what a pod's readiness means (docs/adr/0007). Nil when
// the last lease round reached the store in time, the link is up, and the
// pod holds at least Share(partitions, live pods) valid leases; when that
// share is 0 (more pods than work for them), nil once every partition is
// held by some pod: the pod stands by. So a rolling restart waits for each
// new pod to have taken its partitions over before it stops the next one.
func (m *Manager) Serving() error {
	if m.stopping.Load() {
		return errors.New("cluster: stopping, giving partitions back")
	}
	if m.o.Link != nil && !m.o.Link() {
		return errors.New("cluster: NATS connection down, serving no partition")
	}
	m.mu.Lock()
	err := errors.Join(m.renewErr, m.balanceErr)
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cluster: not counted live, the last lease round failed: %w", err)
	}
	r := m.last.Load()
	if r == nil {
		return errors.New("cluster: no lease round yet")
	}
	held := len(m.Owned())
	switch {
	case r.share == 0 && r.free == 0:
		return nil // stand-by
	case r.share == 0:
		return fmt.Errorf("cluster: stand-by (%d pods for %d partitions) while %d partitions have no owner", r.pods, m.o.Partitions, r.free)
	case held >= r.share:
		return nil
	}
	return fmt.Errorf("cluster: serving %d partitions of its share of %d (%d partitions, %d live pods)", held, r.share, m.o.Partitions, r.pods)
}

func (m *Manager) setValid(p int, sent time.Time) {
	m.valid[p].Store(int64(sent.Sub(m.epoch) + m.o.TTL*3/4))
}

// Run takes, renews and gives back leases until ctx ends. Renewals and the
// rest (announce, listings, take, give back) run on loops of their own,
// each starting a round every TTL/4 (at once after a round that took
// longer), so a slow listing or take never delays a renewal. It returns
// nil once both loops have ended; Close gives the leases up.
func (m *Manager) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { m.loop(ctx, m.renewRound) })
	m.loop(ctx, m.balanceRound)
	wg.Wait()
	return nil
}

func (m *Manager) loop(ctx context.Context, round func(context.Context)) {
	tick := m.o.TTL / 4
	for ctx.Err() == nil {
		start := m.o.Clock.Now()
		round(ctx)
		if !clock.Sleep(m.o.Clock, tick-m.o.Clock.Now().Sub(start), ctx.Done()) {
			return
		}
	}
}

// Step is one round of each of Run's loops, one after the other: the
// renewals, then the balance. Simulations call it directly.
func (m *Manager) Step(ctx context.Context) {
	m.renewRound(ctx)
	m.balanceRound(ctx)
}

func (m *Manager) leaseValue(since time.Time) []byte {
	b, _ := json.Marshal(Lease{Pod: m.o.PodID, Since: since.UTC()})
	return b
}

// opCtx bounds one store operation. It is not cancelled with ctx: a round
// under way when the pod stops completes (within OpTimeout), so that Close
// knows every lease's revision, rather than leaving renewals that were sent
// but not answered.
func (m *Manager) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), m.o.OpTimeout)
}

// renewRound renews every lease at once, each with its own deadline. A
// renewal that gets no answer in time fails the round.
func (m *Manager) renewRound(ctx context.Context) {
	n, err := m.renew(ctx)
	m.mu.Lock()
	was := m.renewErr
	m.renewErr = err
	m.mu.Unlock()
	switch {
	case n == 0:
		// Nothing to renew: no failure, and no news of the link either
		// (the balance round's own operations tell).
	case err != nil && was == nil:
		m.log.Warn().Err(err).Msg("lease renewals failed (NATS unreachable or too slow): this pod withdraws its announcement and takes no partition until a round succeeds")
	case err != nil:
		m.log.Debug().Err(err).Msg("lease renewals failed again")
	case was != nil:
		m.log.Info().Msg("lease renewals succeed again")
	}
}

// balanceRound announces this pod (or withdraws it after a failed round:
// a put that timed out may still land, and the withdrawal lands after it,
// so that the others stop counting this pod live) and lists the pods and
// the leases, at once, each with its own deadline; then, if every
// operation of both loops' last rounds succeeded, it takes or gives back
// partitions towards ⌈P/N⌉.
func (m *Manager) balanceRound(ctx context.Context) {
	m.mu.Lock()
	announce := m.renewErr == nil && m.balanceErr == nil
	m.mu.Unlock()
	var (
		wg                              sync.WaitGroup
		announceErr, podsErr, leasesErr error
		podKeys, leaseKeys              []string
	)
	wg.Go(func() {
		octx, cancel := m.opCtx(ctx)
		defer cancel()
		switch {
		case !announce:
			announceErr = m.pods.Delete(octx, m.o.PodID, 0)
			m.podRev = 0
		case m.podRev == 0:
			m.podRev, announceErr = m.pods.Put(octx, m.o.PodID, m.h.Status())
		default:
			// On the entry's revision, so that an announce that lands
			// after the entry expired (a round too slow) fails instead of
			// bringing the pod back for the others.
			rev, err := m.pods.Update(octx, m.o.PodID, m.h.Status(), m.podRev)
			switch {
			case err == nil:
				m.podRev = rev
			case errors.Is(err, ErrLost):
				m.podRev = 0 // written anew once a round succeeds
			}
			announceErr = err
		}
	})
	wg.Go(func() {
		octx, cancel := m.opCtx(ctx)
		defer cancel()
		podKeys, podsErr = m.pods.Keys(octx)
	})
	wg.Go(func() {
		octx, cancel := m.opCtx(ctx)
		defer cancel()
		leaseKeys, leasesErr = m.leases.Keys(octx)
	})
	wg.Wait()
	var errs []error
	if announceErr != nil {
		errs = append(errs, fmt.Errorf("%s: %w", map[bool]string{true: "announce pod", false: "withdraw pod"}[announce], announceErr))
	}
	if podsErr != nil {
		errs = append(errs, fmt.Errorf("list pods: %w", podsErr))
	}
	if leasesErr != nil {
		errs = append(errs, fmt.Errorf("list leases: %w", leasesErr))
	}
	err := errors.Join(errs...)
	m.mu.Lock()
	was := m.balanceErr
	m.balanceErr = err
	renewing := m.renewErr == nil
	m.mu.Unlock()
	switch {
	case err != nil && was == nil:
		m.log.Warn().Err(err).Msg("lease round failed (NATS unreachable or too slow): this pod withdraws its announcement and takes no partition until a round succeeds")
	case err != nil:
		m.log.Debug().Err(err).Msg("lease round failed again")
	case was != nil:
		m.log.Info().Msg("lease round succeeds again")
	}
	if err != nil || !renewing {
		return
	}
	n := 1
	for _, k := range podKeys {
		if k != m.o.PodID {
			n++
		}
	}
	taken := map[string]bool{}
	for _, k := range leaseKeys {
		taken[k] = true
	}
	m.noteHeldElsewhere(taken)
	free := 0
	for p := range m.o.Partitions {
		if !taken[jobs.LeaseKey(p)] {
			free++
		}
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
	case held < target && !m.stopping.Load() && free > 0:
		free -= m.take(ctx, target-held, taken)
	}
	m.last.Store(&round{pods: n, free: free, share: Share(m.o.Partitions, n)})
	m.log.Debug().Int("pods", n).Int("free", free).Ints("owned", m.Owned()).Msg("lease round")
}

// renew renews every lease at once, each with its own deadline, and
// forgets or deletes those whose release has ended. It returns how many
// leases it tried to renew.
func (m *Manager) renew(ctx context.Context) (int, error) {
	type item struct {
		p   int
		l   *lease
		rev uint64
	}
	var renew, drop []item
	var forgot []int
	m.mu.Lock()
	for p, l := range m.owned {
		if l.releasing {
			select {
			case <-l.released:
				if l.lost {
					delete(m.owned, p)
					forgot = append(forgot, p)
				} else {
					drop = append(drop, item{p, l, l.rev})
				}
				continue
			default:
			}
			if l.lost {
				continue
			}
		}
		renew = append(renew, item{p, l, l.rev})
	}
	m.mu.Unlock()
	if len(forgot) > 0 {
		sort.Ints(forgot)
		m.log.Info().Ints("partitions", forgot).Msg("lost partitions released")
	}
	var (
		wg     sync.WaitGroup
		emu    sync.Mutex
		failed int
		first  error
	)
	for _, it := range drop {
		wg.Go(func() { m.drop(ctx, it.p, it.rev) })
	}
	for _, it := range renew {
		wg.Go(func() {
			if err := m.renewOne(ctx, it.p, it.l, it.rev); err != nil {
				emu.Lock()
				failed++
				if first == nil {
					first = err
				}
				emu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed > 0 {
		return len(renew), fmt.Errorf("renew %d of %d leases: %w", failed, len(renew), first)
	}
	return len(renew), nil
}

// renewOne renews p's lease, at revision rev. It returns an error only when
// the store did not answer in time (or at all): a lease found lost is
// released.
func (m *Manager) renewOne(ctx context.Context, p int, l *lease, rev uint64) error {
	octx, cancel := m.opCtx(ctx)
	defer cancel()
	sent := m.o.Clock.Now()
	next, err := m.leases.Update(octx, jobs.LeaseKey(p), m.leaseValue(l.since), rev)
	var why string
	m.mu.Lock()
	switch {
	case m.owned[p] != l || l.lost:
		// Given up meanwhile.
	case err == nil:
		l.rev, l.lastOK = next, sent
		if !l.releasing {
			m.setValid(p, sent)
		}
	case errors.Is(err, ErrLost):
		// Expired on the server (this pod was stopped, cut off or too slow
		// for longer than the TTL) and possibly taken by another pod.
		why = "partition lease lost; releasing the partition"
		m.loseLocked(ctx, p, l)
		err = nil
	case m.o.Clock.Now().Sub(l.lastOK) >= m.o.TTL:
		// No renewal has succeeded for a TTL: the server has expired the
		// lease, unless a renewal that timed out here landed there after
		// all; then it expires a TTL after that, unserved. Either way it is
		// no longer worth renewing blind.
		why = "partition lease not renewed for a TTL; releasing the partition"
		m.loseLocked(ctx, p, l)
	}
	m.mu.Unlock()
	if why != "" {
		m.log.Warn().Int("partition", p).Err(err).Msg(why)
	}
	if err != nil {
		return fmt.Errorf("partition %d: %w", p, err)
	}
	return nil
}

// loseLocked stops serving p, whose lease is no longer this pod's: Owns is
// false at once, and the worker's release runs in the background, so that
// the renewals of the other partitions never wait for a partition's pull
// or requests to end. m.mu must be held.
func (m *Manager) loseLocked(ctx context.Context, p int, l *lease) {
	m.valid[p].Store(0)
	l.lost = true
	if l.releasing {
		return // its graceful release runs already; the lease is not deleted
	}
	l.releasing = true
	l.released = make(chan struct{})
	go func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.TTL/4)
		defer cancel()
		m.h.Release(rctx, p)
		close(l.released)
	}()
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// drop gives up a released partition's lease, at revision rev.
func (m *Manager) drop(ctx context.Context, p int, rev uint64) {
	octx, cancel := m.opCtx(ctx)
	defer cancel()
	if err := m.leases.Delete(octx, jobs.LeaseKey(p), rev); err != nil {
		m.log.Warn().Int("partition", p).Err(err).Msg("give up partition lease (it expires by itself)")
	}
	m.mu.Lock()
	delete(m.owned, p)
	m.mu.Unlock()
	m.log.Info().Int("partition", p).Msg("partition given back")
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

// noteHeldElsewhere records when the listing found each key of taken held
// by another pod, and forgets what is older than heldRecently.
func (m *Manager) noteHeldElsewhere(taken map[string]bool) {
	now := m.o.Clock.Now()
	if m.heldElsewhere == nil {
		m.heldElsewhere = map[string]time.Time{}
	}
	mine := map[string]bool{}
	m.mu.Lock()
	for p, l := range m.owned {
		if !l.lost {
			mine[jobs.LeaseKey(p)] = true
		}
	}
	m.mu.Unlock()
	for k := range taken {
		if !mine[k] {
			m.heldElsewhere[k] = now
		}
	}
	for k := range mine {
		delete(m.heldElsewhere, k) // held here since: this pod's pacer knows what it learned
	}
	for k, at := range m.heldElsewhere {
		if now.Sub(at) > m.heldRecently() {
			delete(m.heldElsewhere, k)
		}
	}
}

// heldRecently is how long after a listing found a lease held by another
// pod a take of it holds its first requests (takeOverFence).
func (m *Manager) heldRecently() time.Duration { return heldRecently(m.o.TTL, m.o.ExpiredHold) }

// heldRecently is how long a sighting of a lease held by another pod marks
// a take of it as a take-over of an expired lease: the lease expires at
// most a TTL after the listing (two, counting a renewal just after it), and
// its owner's last facts may come up to hold later.
func heldRecently(ttl, hold time.Duration) time.Duration { return 2*ttl + hold }

// takeOverFence is the take-over's fence instant (Hooks.Acquired's since,
// which the worker gives pacer.Pacer.Fence for each of the partition's
// authorities): the last start the previous owner may have made, for a
// lease whose Create was sent at sent. The previous owner's validity ended
// before the key expired or was deleted (3/4 TTL after its last renewal's
// send against a TTL after its arrival), so it started nothing after sent.
// A lease seen held by another pod (at seen, when sighted) within
// heldRecently, and gone without a deletion marker (given false), expired:
// its owner was killed, stopped or cut off, and may yet publish a wait it
// learned, so the instant moves hold later and held is true. A cold start,
// a lease given back, and this pod's own expired lease (never sighted
// elsewhere: its pacer knows what it learned) are not held.
func takeOverFence(sent, seen time.Time, sighted, given bool, ttl, hold time.Duration) (since time.Time, held bool) {
	if sighted && !given && hold > 0 && sent.Sub(seen) <= heldRecently(ttl, hold) {
		return sent.Add(hold), true
	}
	return sent, false
}

// take acquires up to n of the partitions the listing found free (taken
// are the others), starting at a place that depends on the pod id so that
// pods starting together do not race for the same. It returns how many it
// took.
func (m *Manager) take(ctx context.Context, n int, taken map[string]bool) int {
	h := fnv.New32a()
	h.Write([]byte(m.o.PodID))
	start := int(h.Sum32() % uint32(m.o.Partitions))
	var cands []int
	m.mu.Lock()
	for i := 0; i < m.o.Partitions && len(cands) < n; i++ {
		p := (start + i) % m.o.Partitions
		if _, mine := m.owned[p]; !mine && !taken[jobs.LeaseKey(p)] {
			cands = append(cands, p)
		}
	}
	m.mu.Unlock()
	// One partition at a time, each served right after its Create, as a
	// pod always has: with every Create first and every partition served
	// at once, the first requests to a partition's authorities came in
	// pairs less than 1 ms apart (a take of 32 partitions at start-up, in
	// two process-test runs): the fence from a since older than the first
	// dispatch did not hold them apart (docs/adr/0007). The renewals, on
	// their own loop, keep the leases taken so far meanwhile.
	var got, expired []int
	for _, p := range cands {
		octx, cancel := m.opCtx(ctx)
		sent := m.o.Clock.Now()
		rev, given, err := m.leases.Create(octx, jobs.LeaseKey(p), m.leaseValue(sent))
		cancel()
		if err != nil {
			continue // another pod was quicker, or the store did not answer
		}
		seen, ok := m.heldElsewhere[jobs.LeaseKey(p)]
		since, held := takeOverFence(sent, seen, ok, given, m.o.TTL, m.o.ExpiredHold)
		if held {
			expired = append(expired, p)
		}
		delete(m.heldElsewhere, jobs.LeaseKey(p))
		// Held (and so renewed) and valid before the worker starts
		// pulling, so that the first jobs it receives are served rather
		// than handed back.
		l := &lease{rev: rev, since: sent, lastOK: sent}
		m.mu.Lock()
		m.owned[p] = l
		m.setValid(p, sent)
		m.mu.Unlock()
		actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.TTL)
		err = m.h.Acquired(actx, p, since)
		acancel()
		if err != nil {
			m.log.Warn().Int("partition", p).Err(err).Msg("serve partition")
			m.mu.Lock()
			m.loseLocked(ctx, p, l)
			rev := l.rev
			m.mu.Unlock()
			dctx, dcancel := m.opCtx(ctx)
			_ = m.leases.Delete(dctx, jobs.LeaseKey(p), rev)
			dcancel()
			continue
		}
		got = append(got, p)
	}
	if len(got) > 0 {
		sort.Ints(got)
		m.log.Info().Ints("partitions", got).Msg("partitions taken")
	}
	if len(expired) > 0 {
		m.log.Info().Ints("partitions", expired).Dur("hold", m.o.ExpiredHold).
			Msg("partitions taken over from expired leases: their first requests wait for the hold, for facts their previous owner may still publish")
	}
	return len(got)
}

// Close gives up every lease and this pod's entry, so that other pods take
// the partitions at once instead of after the TTL. Call it after the worker
// has stopped (every job handed back, no request in flight).
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	revs := map[int]uint64{}
	for p, l := range m.owned {
		m.valid[p].Store(0)
		if !l.lost {
			revs[p] = l.rev
		}
	}
	m.owned = map[int]*lease{}
	m.mu.Unlock()
	var (
		wg   sync.WaitGroup
		emu  sync.Mutex
		errs []error
	)
	for p, rev := range revs {
		wg.Go(func() {
			if err := m.leases.Delete(ctx, jobs.LeaseKey(p), rev); err != nil {
				emu.Lock()
				errs = append(errs, fmt.Errorf("partition %d: %w", p, err))
				emu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := m.pods.Delete(ctx, m.o.PodID, 0); err != nil {
		errs = append(errs, fmt.Errorf("pod entry: %w", err))
	}
	return errors.Join(errs...)
}
