package worker

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// Defaults of AuthRule, the handling of 401 and 403 answers
// (docs/adr/0020-credentials-and-egress-proxies.md).
const (
	// DefaultAuthHold is an authority's first hold after it refused the
	// credential; each further hold doubles it (1, 2, 4 min by default),
	// so a rotation has 7 minutes to land before a job is dead-lettered.
	DefaultAuthHold = time.Minute
	// DefaultAuthHolds is the holds without a success in between after
	// which the credential is taken as wrong: every later 401/403 from the
	// authority dead-letters its job auth_failed at once.
	DefaultAuthHolds = 3
	// DefaultAuthStreak is the answers 401/403 in a row, with no success
	// between them, that hold the authority.
	DefaultAuthStreak = 2
	// DefaultAuthAttempts is the 401/403 answers one job may get, while
	// its authority otherwise works, before it is dead-lettered auth_failed
	// (an object the credential may not read).
	DefaultAuthAttempts = 3
)

// AuthRule is how the worker treats 401 and 403 answers (fetch.ClassAuthFailed;
// a 403 the pacer reads as a rate limit is a throttle instead). They say
// the credential is wrong, missing or being rotated, not that the job is
// bad, so the authority is held rather than its backlog dead-lettered:
//
//   - Streak answers 401/403 in a row from an authority hold it: the pacer
//     starts no request to it for Hold (doubling with each hold), its jobs
//     wait (deferred or parked, no failure budget used), and the job that
//     got the answer waits with them.
//   - A change of the authority's credential (a reload of the files that
//     changes its entry) ends the hold at once and starts the count again.
//   - After Holds holds with no success in between, the credential is
//     wrong: each later 401/403 dead-letters its job auth_failed, one
//     request per job. A success clears it all.
//   - A single 401/403 while the authority otherwise works is the object's:
//     the job is retried with backoff (counted in its failure budget) and
//     dead-lettered auth_failed at its Attempts-th such answer.
//
// The zero value, and every zero field, is the default given on the
// constants above.
type AuthRule struct {
	Hold     time.Duration
	Holds    int
	Streak   int
	Attempts int
}

func (r AuthRule) withDefaults() AuthRule {
	if r.Hold <= 0 {
		r.Hold = DefaultAuthHold
	}
	if r.Holds <= 0 {
		r.Holds = DefaultAuthHolds
	}
	if r.Streak <= 0 {
		r.Streak = DefaultAuthStreak
	}
	if r.Attempts <= 0 {
		r.Attempts = DefaultAuthAttempts
	}
	return r
}

// authAction is what AuthRule decides for one 401/403.
type authAction int

const (
	authRetry      authAction = iota // count it against the job, retry with backoff
	authHold                         // hold the authority until the deadline; defer the job to it
	authDefer                        // the authority is held already: defer the job to the deadline
	authDeadLetter                   // the credential is wrong: dead-letter auth_failed
)

// authGuard keeps AuthRule's state per authority. Its zero value is ready;
// safe for concurrent use.
type authGuard struct {
	mu sync.Mutex
	m  map[string]*authState
}

type authState struct {
	version uint64    // the credential version the failures came with
	streak  int       // 401/403 in a row
	holds   int       // holds since the last success
	until   time.Time // end of the hold in force
}

// failed records a 401/403 from auth with credential version v at now.
func (g *authGuard) failed(r AuthRule, now time.Time, auth string, v uint64) (authAction, time.Time, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[string]*authState{}
	}
	st := g.m[auth]
	if st == nil || st.version != v {
		// New, or an answer to the credential before a change: the new
		// credential starts afresh (an old answer may still hold it).
		st = &authState{version: v}
		g.m[auth] = st
	}
	if now.Before(st.until) {
		return authDefer, st.until, st.holds
	}
	st.streak++
	switch {
	case st.holds >= r.Holds:
		return authDeadLetter, time.Time{}, st.holds
	case st.streak >= r.Streak:
		st.holds++
		st.until = now.Add(r.Hold << (st.holds - 1))
		return authHold, st.until, st.holds
	}
	return authRetry, time.Time{}, st.holds
}

// succeeded forgets auth's failures: its credential works.
func (g *authGuard) succeeded(auth string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, auth)
}

// changed forgets the failures of the authorities changed matches and
// returns those that were held, with the hold's end.
func (g *authGuard) changed(changed func(authority.Authority) bool) map[string]time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	held := map[string]time.Time{}
	for auth, st := range g.m {
		host, port := authority.Split(auth)
		if !changed(authority.Authority{Host: host, Port: port}) {
			continue
		}
		if !st.until.IsZero() {
			held[auth] = st.until
		}
		delete(g.m, auth)
	}
	return held
}

// pauser is the part of *pacer.Pacer that holds an authority: an optional
// feature of the worker's Pacer (without it the job alone is deferred).
type pauser interface {
	Apply(now time.Time, ev pacer.Event)
	ReadyIn(now time.Time, auth string) (wait, spacing time.Duration, reason pacer.Reason)
}

var _ pauser = (*pacer.Pacer)(nil)

// authHoldReason marks the pacer pauses the worker takes for AuthRule.
const authHoldReason = "auth_failed"

// noteAuth tells the guard about a hop's answer: a 2xx or 304 proves the
// authority's credential.
func (w *Worker) noteAuth(auth string, status int) {
	if status >= 200 && status < 300 || status == 304 {
		w.auth.succeeded(auth)
	}
}

// authFailed settles a job whose final answer was 401 or 403, by AuthRule.
func (w *Worker) authFailed(ctx context.Context, j *heldJob, resp *fetch.Response) {
	r := w.o.Auth.withDefaults()
	auth := j.auth
	if a, err := authority.Parse(resp.FinalURL); err == nil {
		auth = a.String() // the hop that refused (a redirect's own authority)
	}
	now := w.clk.Now()
	act, until, holds := w.auth.failed(r, now, auth, resp.CredentialVersion)
	status := resp.Status
	switch act {
	case authHold:
		if p, ok := w.d.Pacer.(pauser); ok {
			p.Apply(now, pacer.Event{Type: pacer.EventPaused, Authority: auth, At: now, Until: until, Reason: authHoldReason})
		}
		w.log.Warn().Str("authority", auth).Int("status", status).Int("hold", holds).Int("holds", r.Holds).
			Time("until", until).Msg("authority refuses its credential: no request to it until the hold ends or its credential changes")
		fallthrough
	case authDefer:
		w.settler.deferJob(deferral{job: j, delay: max(until.Sub(now), time.Millisecond), reason: "auth_hold"})
	case authDeadLetter:
		w.settler.deadLetter(ctx, j, jobs.ReasonAuthFailed,
			fmt.Sprintf("%s answered %d %s; it refused the credential through %d holds without a success", auth, status, credentialNote(resp), holds), status, nil)
	default:
		w.settler.transient(ctx, j, jobs.ReasonAuthFailed, status, auth+" answered "+strconv.Itoa(status)+" "+credentialNote(resp))
	}
}

func credentialNote(resp *fetch.Response) string {
	if resp.CredentialVersion == 0 {
		return "(no credential configured for it)"
	}
	return "(credential version " + strconv.FormatUint(resp.CredentialVersion, 10) + ")"
}

// CredentialsChanged is told the authorities whose credential changed
// (credentials.Store.OnChange): their failures are forgotten and a hold
// the worker took on them ends now, so that the new credential is tried
// at once. An operator's pause is left alone.
func (w *Worker) CredentialsChanged(changed func(authority.Authority) bool) {
	held := w.auth.changed(changed)
	p, ok := w.d.Pacer.(pauser)
	if !ok {
		return
	}
	now := w.clk.Now()
	for auth, until := range held {
		wait, _, reason := p.ReadyIn(now, auth)
		if reason != pacer.ReasonPaused || now.UnixNano()+int64(wait) != until.UnixNano() {
			continue // the hold is over, or a longer pause (an operator's) is in force
		}
		p.Apply(now, pacer.Event{Type: pacer.EventResumed, Authority: auth, At: now, Reason: authHoldReason})
		w.log.Info().Str("authority", auth).Msg("credential changed: hold lifted")
	}
	w.poke()
}

// countReason is the attempts with reason.
func countReason(as []jobs.Attempt, reason string) int {
	n := 0
	for _, a := range as {
		if a.Reason == reason {
			n++
		}
	}
	return n
}
