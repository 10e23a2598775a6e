package policy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/bytesize"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// Defaults of Options.
const (
	DefaultHistory    = 8 // revisions kept per key: what was in force before, for an audit
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 5 * time.Second
)

// BucketConfig is MIRROR_POLICY's configuration with replicas (0: 1).
// Keys carry no TTL: an override's end is its Until, which the pods honour.
func BucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "mirrorworker live politeness policy (mirrorworker policy set|show|list|delete)",
		History:     DefaultHistory,
		Replicas:    max(1, replicas),
		Storage:     jetstream.FileStorage,
	}
}

// EnsureBucket returns MIRROR_POLICY, creating it with replicas when it
// does not exist. An existing bucket is used as it is.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("bucket %s: %w", Bucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, BucketConfig(replicas))
	if errors.Is(err, jetstream.ErrBucketExists) { // another pod was first
		kv, err = js.KeyValue(ctx, Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", Bucket, err)
	}
	return kv, nil
}

// Options configure a Watcher.
type Options struct {
	// Base is the static policy (--policy FILE, --floor, --max-in-flight);
	// nil is the defaults.
	Base *pacer.Policy
	// Apply receives every merged policy (pacer.Pacer.SetPolicy); required.
	// It is called from Open and from Run's goroutine, never concurrently.
	Apply func(*pacer.Policy)
	// Replicas of the bucket when Open creates it (0: 1).
	Replicas int
	// Clock ends overrides at their Until and times the re-watch backoff;
	// nil is the wall clock.
	Clock clock.Clock
	// MinBackoff and MaxBackoff bound the re-watch delay, doubled after
	// each failed watch and jittered; 0 means DefaultMinBackoff and
	// DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Registerer gets the watcher's metrics; nil keeps them private.
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
}

// Watcher keeps a pacer's policy equal to the bucket merged over the
// static policy. Open loads it; Run follows it. It is safe for concurrent
// use.
type Watcher struct {
	kv jetstream.KeyValue
	o  Options
	m  *metrics

	mu      sync.Mutex
	vals    map[string]Value  // by authority or DefaultKey
	revs    map[string]uint64 // revision of each value
	ended   map[string]bool   // keys whose Until has passed and was logged
	next    time.Time         // earliest Until ahead
	current jetstream.KeyWatcher
	changed func()
}

type metrics struct {
	changes, invalid, restarts prometheus.Counter
	overrides                  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		changes: prometheus.NewCounter(prometheus.CounterOpts{Name: "mirrorworker_policy_changes_total",
			Help: "Changes of the live policy (MIRROR_POLICY) applied to this pod's pacer: keys set or deleted, overrides ended at their until."}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{Name: "mirrorworker_policy_invalid_total",
			Help: "MIRROR_POLICY values ignored because they do not parse (the key keeps its previous value)."}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{Name: "mirrorworker_policy_watch_restarts_total",
			Help: "Times the watch of MIRROR_POLICY was lost and started again."}),
		overrides: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mirrorworker_policy_overrides",
			Help: "MIRROR_POLICY keys in force on this pod (the default key included; overrides past their until excluded)."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.changes, m.invalid, m.restarts, m.overrides} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register policy metrics: %w", err)
		}
	}
	return m, nil
}

// Open ensures the bucket, loads every value in it, merges them over
// o.Base and applies the result before it returns, so that a pod built
// after Open never sends a request under a policy it has not read. Then
// run Run to follow changes.
func Open(ctx context.Context, js jetstream.JetStream, o Options) (*Watcher, error) {
	if o.Apply == nil {
		return nil, errors.New("policy: Options.Apply is required")
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	kv, err := EnsureBucket(ctx, js, o.Replicas)
	if err != nil {
		return nil, err
	}
	w := &Watcher{kv: kv, o: o, m: m, ended: map[string]bool{}}
	kw, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", Bucket, err)
	}
	defer kw.Stop()
	vals, revs, err := w.initial(ctx, kw)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", Bucket, err)
	}
	w.replace(vals, revs, "loaded")
	return w, nil
}

var errWatchLost = errors.New("policy watch lost")

// Run follows the bucket until ctx ends, applying every change as it
// arrives and ending overrides at their Until. A watch that ends (its
// subscription lost) is started again after a backoff (MinBackoff doubled
// up to MaxBackoff, jittered, reset once a watch has loaded), and the
// values it loads replace the old ones whole, so a key deleted meanwhile
// is not kept. Run returns nil when ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	backoff := w.o.MinBackoff
	for {
		kw, err := w.kv.WatchAll(ctx)
		loaded := false
		if err == nil {
			loaded, err = w.follow(ctx, kw)
		}
		if ctx.Err() != nil {
			return nil
		}
		if loaded {
			backoff = w.o.MinBackoff
		}
		w.m.restarts.Inc()
		d := time.Duration(float64(backoff) * (0.5 + rand.Float64()/2))
		w.o.Logger.Warn().Err(err).Dur("retry_in", d).Msg("policy watch of " + Bucket + " lost; the policy in force stays until it is watched again")
		t := w.o.Clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		backoff = min(2*backoff, w.o.MaxBackoff)
	}
}

// initial reads a watch's initial values, up to the nil entry that ends
// them.
func (w *Watcher) initial(ctx context.Context, kw jetstream.KeyWatcher) (map[string]Value, map[string]uint64, error) {
	vals, revs := map[string]Value{}, map[string]uint64{}
	for {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case e, ok := <-kw.Updates():
			if !ok {
				return nil, nil, errWatchLost
			}
			if e == nil {
				return vals, revs, nil
			}
			if e.Operation() != jetstream.KeyValuePut {
				continue
			}
			auth, v, err := w.parse(e)
			if err != nil {
				continue
			}
			vals[auth], revs[auth] = v, e.Revision()
		}
	}
}

// follow runs one watch; loaded reports whether it got past its initial
// values.
func (w *Watcher) follow(ctx context.Context, kw jetstream.KeyWatcher) (loaded bool, err error) {
	w.mu.Lock()
	w.current = kw
	w.mu.Unlock()
	defer kw.Stop()
	vals, revs, err := w.initial(ctx, kw)
	if err != nil {
		return false, err
	}
	w.replace(vals, revs, "watched")
	t := w.o.Clock.NewTimer(time.Hour)
	defer t.Stop()
	var armed time.Time // zero: the hour
	for {
		w.arm(t, &armed)
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case e, ok := <-kw.Updates():
			if !ok {
				return true, errWatchLost
			}
			if e != nil {
				w.update(e)
			}
		case <-t.C():
			w.mu.Lock()
			w.applyLocked()
			w.mu.Unlock()
			armed = time.Time{}.Add(-1) // fired: arm again whatever the next
		}
	}
}

// arm sets t to fire at the earliest Until ahead (or in an hour, which
// changes nothing) unless it is already set for that instant: re-arming a
// timer for the same deadline could only lose a firing.
func (w *Watcher) arm(t clock.Timer, armed *time.Time) {
	w.mu.Lock()
	next := w.next
	w.mu.Unlock()
	if next.Equal(*armed) {
		return
	}
	if !t.Stop() {
		select {
		case <-t.C():
		default:
		}
	}
	d := time.Hour
	if !next.IsZero() {
		d = max(0, next.Sub(w.o.Clock.Now()))
	}
	t.Reset(d)
	*armed = next
}

func (w *Watcher) parse(e jetstream.KeyValueEntry) (string, Value, error) {
	auth, err := ParseKey(e.Key())
	if err == nil {
		var v Value
		if v, err = ParseValue(e.Value()); err == nil {
			if err = CheckKeyValue(auth, v); err == nil {
				return auth, v, nil
			}
		}
	}
	w.m.invalid.Inc()
	w.o.Logger.Error().Err(err).Str("key", e.Key()).Uint64("revision", e.Revision()).
		Msg("ignored a " + Bucket + " value (write it with 'mirrorworker policy set'); the key keeps what it had")
	return "", Value{}, err
}

// replace installs a watch's initial values whole.
func (w *Watcher) replace(vals map[string]Value, revs map[string]uint64, how string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := len(vals) != len(w.vals)
	var moved []string // keys whose value is not the one applied so far
	for a, r := range revs {
		if w.revs[a] != r {
			changed = true
			moved = append(moved, a)
		}
	}
	prev := w.revs
	w.vals, w.revs = vals, revs
	w.applyLocked()
	if how != "loaded" {
		// A change made while no watch ran (between Open's load and Run's
		// watch, or while a lost watch was started again) arrives among
		// the initial values: it is said as one that arrived alone.
		sort.Strings(moved)
		for _, a := range moved {
			w.logChange(a, revs[a], vals[a])
		}
		for a, r := range prev {
			if _, ok := revs[a]; !ok {
				w.o.Logger.Info().Str("authority", a).Uint64("revision", r).
					Msg("policy key deleted: the authority has the policy below it again")
			}
		}
	}
	if changed || how == "loaded" {
		keys := make([]string, 0, len(vals))
		for a := range vals {
			keys = append(keys, a)
		}
		sort.Strings(keys)
		w.o.Logger.Info().Strs("keys", keys).Msg("policy " + how + " from " + Bucket)
	}
}

// update applies one change.
func (w *Watcher) update(e jetstream.KeyValueEntry) {
	var (
		auth string
		v    Value
		err  error
		put  = e.Operation() == jetstream.KeyValuePut
	)
	if put {
		if auth, v, err = w.parse(e); err != nil {
			return
		}
	} else if auth, err = ParseKey(e.Key()); err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if put {
		w.vals[auth], w.revs[auth] = v, e.Revision()
		delete(w.ended, auth)
	} else {
		delete(w.vals, auth)
		delete(w.revs, auth)
	}
	w.m.changes.Inc()
	w.applyLocked()
	if !put {
		w.o.Logger.Info().Str("authority", auth).Uint64("revision", e.Revision()).
			Msg("policy key deleted: the authority has the policy below it again")
		return
	}
	w.logChange(auth, e.Revision(), v)
}

// logChange says that auth's value v, at revision rev, is applied.
func (w *Watcher) logChange(auth string, rev uint64, v Value) {
	ev := w.o.Logger.Info().Str("authority", auth).Uint64("revision", rev)
	if v.Floor != nil {
		ev = ev.Str("floor", v.Floor.String())
	}
	if v.MaxInFlight != nil {
		ev = ev.Int("max_in_flight", *v.MaxInFlight)
	}
	if v.Bandwidth != nil {
		ev = ev.Str("bandwidth", bytesize.FormatRate(*v.Bandwidth))
	}
	if v.FirstStep != nil {
		ev = ev.Str("first_step", v.FirstStep.String())
	}
	if v.Decay != nil {
		ev = ev.Int("decay", *v.Decay)
	}
	if !v.Until.IsZero() {
		ev = ev.Time("until", v.Until)
	}
	ev.Str("reason", v.Reason).Msg("policy changed")
}

// applyLocked merges and applies the values at the clock's now. w.mu must
// be held.
func (w *Watcher) applyLocked() {
	now := w.o.Clock.Now()
	p, next := Merge(w.o.Base, w.vals, now)
	w.o.Apply(p)
	if w.changed != nil {
		w.changed()
	}
	w.next = next
	active := 0
	for a, v := range w.vals {
		if v.Active(now) {
			active++
			continue
		}
		if !w.ended[a] {
			w.ended[a] = true
			w.m.changes.Inc()
			w.o.Logger.Info().Str("authority", a).Time("until", v.Until).Str("reason", v.Reason).
				Msg("policy override ended at its until: the authority has the policy below it again")
		}
	}
	w.m.overrides.Set(float64(active))
}

// OnChange sets f to be called after every policy applied from now on (a
// worker's Repace, so that a lowered floor is used at once by jobs already
// waiting). f must not call the Watcher.
func (w *Watcher) OnChange(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.changed = f
}

// Values returns the values in the bucket as this pod last read them, by
// authority (or DefaultKey), those past their Until included.
func (w *Watcher) Values() map[string]Value {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]Value, len(w.vals))
	for a, v := range w.vals {
		out[a] = v
	}
	return out
}
