package worker

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
)

// TestAuthRule walks AuthRule on virtual time: a streak holds the
// authority with doubling holds, answers during a hold only defer, the
// holds run out into dead letters, a success or a changed credential
// starts again, and an isolated 401 is the job's.
func TestAuthRule(t *testing.T) {
	r := AuthRule{Hold: time.Minute, Holds: 3, Streak: 2}.withDefaults()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "files.example.org:443"
	type step struct {
		at      time.Duration
		op      string // "fail", "ok", "change"
		version uint64
		want    authAction
		until   time.Duration // for hold/defer
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"rotation never lands", []step{
			{0, "fail", 1, authRetry, 0},
			{time.Second, "fail", 1, authHold, time.Second + time.Minute},
			{2 * time.Second, "fail", 1, authDefer, time.Second + time.Minute}, // in flight during the hold
			{61 * time.Second, "fail", 1, authHold, 61*time.Second + 2*time.Minute},
			{181 * time.Second, "fail", 1, authHold, 181*time.Second + 4*time.Minute},
			{421 * time.Second, "fail", 1, authDeadLetter, 0},
			{422 * time.Second, "fail", 1, authDeadLetter, 0},
			{423 * time.Second, "ok", 1, 0, 0},
			{424 * time.Second, "fail", 1, authRetry, 0},
		}},
		{"a new credential starts afresh", []step{
			{0, "fail", 1, authRetry, 0},
			{time.Second, "fail", 1, authHold, time.Second + time.Minute},
			{2 * time.Second, "fail", 2, authRetry, 0}, // the new version is not held by the old one's hold
			{3 * time.Second, "change", 0, 0, 0},
			{4 * time.Second, "fail", 2, authRetry, 0},
		}},
		{"isolated refusals are the object's", []step{
			{0, "fail", 1, authRetry, 0},
			{time.Second, "ok", 1, 0, 0},
			{2 * time.Second, "fail", 1, authRetry, 0},
			{3 * time.Second, "ok", 1, 0, 0},
			{4 * time.Second, "fail", 1, authRetry, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var g authGuard
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				switch s.op {
				case "ok":
					g.succeeded(a)
				case "change":
					g.changed(func(x authority.Authority) bool { return x.String() == a })
				default:
					act, until, _ := g.failed(r, now, a, s.version)
					if act != s.want {
						t.Fatalf("step %d: action %d, want %d", i, act, s.want)
					}
					if (s.want == authHold || s.want == authDefer) && !until.Equal(t0.Add(s.until)) {
						t.Fatalf("step %d: until %s, want %s", i, until.Sub(t0), s.until)
					}
				}
			}
		})
	}
	// changed reports the holds it ended, and only for its authorities.
	var g authGuard
	g.failed(r, t0, a, 1)
	g.failed(r, t0, a, 1)
	g.failed(r, t0, "other.example:443", 1)
	held := g.changed(func(x authority.Authority) bool { return x.Host == "files.example.org" })
	if len(held) != 1 || !held[a].Equal(t0.Add(time.Minute)) {
		t.Errorf("changed = %v, want the hold of %s", held, a)
	}
	if act, _, _ := g.failed(r, t0, "other.example:443", 1); act != authHold {
		t.Errorf("another authority's streak was reset: %d", act)
	}
}
