package replay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// Waits returns the pacer state of each of auths (authorities, "host:port")
// that has one, so that a replay whose last jobs are held up can say what
// they wait for (issue 37): a cooldown, a backoff, a pause, a probe. An
// authority without a state is waiting in a queue for nothing the pacer
// knows.
type Waits func(ctx context.Context, auths []string) (map[string]pacer.State, error)

// PodWaits is Waits from the live pods' status in jobs.PodsBucket: the
// owner pod's pacer state of each authority (worker.PodStatus lists the
// authorities that are not idle).
func PodWaits(js jetstream.JetStream) Waits {
	return func(ctx context.Context, auths []string) (map[string]pacer.State, error) {
		kv, err := js.KeyValue(ctx, jobs.PodsBucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", jobs.PodsBucket, err)
		}
		// The part of a worker.PodStatus a replay reads.
		type podStatus struct {
			Authorities []pacer.State `json:"authorities"`
		}
		pods, err := jobs.Entries[podStatus](ctx, js, kv)
		if err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		want := map[string]bool{}
		for _, a := range auths {
			want[a] = true
		}
		out := map[string]pacer.State{}
		for _, p := range pods {
			for _, s := range p.Authorities {
				if want[s.Authority] {
					out[s.Authority] = s
				}
			}
		}
		return out, nil
	}
}

// PacerWaits is Waits from a replay's own pacer (a replay with no pod).
func PacerWaits(p *pacer.Pacer, now func() time.Time) Waits {
	return func(_ context.Context, auths []string) (map[string]pacer.State, error) {
		want := map[string]bool{}
		for _, a := range auths {
			want[a] = true
		}
		out := map[string]pacer.State{}
		for _, s := range p.Snapshot(now()) {
			if want[s.Authority] {
				out[s.Authority] = s
			}
		}
		return out, nil
	}
}

// maxWaitsShown bounds the authorities a progress line names.
const maxWaitsShown = 3

// waitLine says what the jobs left wait for, busiest authority first:
// "1 job waits: 127.0.0.1:18766 in backoff until 14:59:02", or "12 jobs
// wait: a.example:443 (9) cooling until 14:59:02; b.example:443 (3) in a
// queue". Times are shown in loc.
func waitLine(left map[string]int, states map[string]pacer.State, loc *time.Location) string {
	auths := make([]string, 0, len(left))
	total := 0
	for a, n := range left {
		if n > 0 {
			auths = append(auths, a)
			total += n
		}
	}
	if total == 0 {
		return ""
	}
	sort.Slice(auths, func(i, j int) bool {
		if left[auths[i]] != left[auths[j]] {
			return left[auths[i]] > left[auths[j]]
		}
		return auths[i] < auths[j]
	})
	parts := make([]string, 0, maxWaitsShown+1)
	for i, a := range auths {
		if i == maxWaitsShown {
			parts = append(parts, fmt.Sprintf("%d more", len(auths)-i))
			break
		}
		name := a
		if len(auths) > 1 {
			name = fmt.Sprintf("%s (%d)", a, left[a])
		}
		parts = append(parts, name+" "+waitingFor(states[a], loc))
	}
	verb := "jobs wait"
	if total == 1 {
		verb = "job waits"
	}
	return fmt.Sprintf("%d %s: %s", total, verb, strings.Join(parts, "; "))
}

// waitingFor renders what an authority's jobs wait for, from its state.
func waitingFor(s pacer.State, loc *time.Location) string {
	at := func(t time.Time) string { return t.In(loc).Format("15:04:05") }
	switch {
	case !s.PausedUntil.IsZero():
		return "paused until " + at(s.PausedUntil)
	case s.State == pacer.StateBackoff && !s.BackoffUntil.IsZero():
		return "in backoff until " + at(s.BackoffUntil)
	case s.State == pacer.StateCooling && !s.CooldownUntil.IsZero():
		return "cooling until " + at(s.CooldownUntil)
	case s.State == pacer.StateProbing || s.Probing:
		return "probing (one request at a time)"
	case s.State == pacer.StateEscalated:
		return fmt.Sprintf("at a raised interval of %s", s.Interval)
	}
	return "in a queue"
}
