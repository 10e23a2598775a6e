package worker

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/rs/zerolog"
)

// authAction is what AuthRule decides for one 401/403.
type authAction int

const (
	authRetry      authAction = iota // count it against the job, retry with backoff
	authHold                         // hold the authority until the deadline; defer the job to it
	authDefer                        // the authority is held already: defer the job to the deadline
	authDeadLetter                   // the credential is wrong: dead-letter auth_failed
)

// authGuard keeps AuthRule's state per authority and settles the jobs
// refused by their credential. Its zero value keeps the state (failed,
// succeeded, changed); refused needs its deps. Safe for concurrent use.
type authGuard struct {
	d authDeps

	mu sync.Mutex
	m  map[string]*authState
}

// authDeps are what the guard holds authorities and settles jobs with.
type authDeps struct {
	rule    AuthRule // with its defaults
	pacer   Pacer    // holds and resumes the authority
	clk     clock.Clock
	log     zerolog.Logger
	settler *settler
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

// authHoldReason marks the pacer pauses the worker takes for AuthRule.
const authHoldReason = "auth_failed"

// answered tells the guard about a hop's answer: a 2xx or 304 proves the
// authority's credential.
func (g *authGuard) answered(auth string, status int) {
	if status >= 200 && status < 300 || status == 304 {
		g.succeeded(auth)
	}
}

// refused settles a job whose final answer was 401 or 403, by AuthRule.
func (g *authGuard) refused(ctx context.Context, j *heldJob, resp *fetch.Response) {
	r := g.d.rule
	auth := j.auth
	if a, err := authority.Parse(resp.FinalURL); err == nil {
		auth = a.String() // the hop that refused (a redirect's own authority)
	}
	now := g.d.clk.Now()
	act, until, holds := g.failed(r, now, auth, resp.CredentialVersion)
	status := resp.Status
	switch act {
	case authHold:
		g.d.pacer.Apply(now, pacer.Event{Type: pacer.EventPaused, Authority: auth, At: now, Until: until, Reason: authHoldReason})
		g.d.log.Warn().Str("authority", auth).Int("status", status).Int("hold", holds).Int("holds", r.Holds).
			Time("until", until).Msg("authority refuses its credential: no request to it until the hold ends or its credential changes")
		fallthrough
	case authDefer:
		g.d.settler.deferJob(deferral{job: j, delay: max(until.Sub(now), time.Millisecond), reason: reasonAuthHold})
	case authDeadLetter:
		g.d.settler.deadLetter(ctx, j, jobs.ReasonAuthFailed,
			fmt.Sprintf("%s answered %d %s; it refused the credential through %d holds without a success", auth, status, credentialNote(resp), holds), status, nil)
	default:
		g.d.settler.transient(ctx, j, jobs.ReasonAuthFailed, status, auth+" answered "+strconv.Itoa(status)+" "+credentialNote(resp))
	}
}

func credentialNote(resp *fetch.Response) string {
	if resp.CredentialVersion == 0 {
		return "(no credential configured for it)"
	}
	return "(credential version " + strconv.FormatUint(resp.CredentialVersion, 10) + ")"
}

// credentialsChanged forgets the failures of the authorities whose
// credential changed and ends the holds it took on them (Worker.CredentialsChanged).
// An operator's pause is left alone.
func (g *authGuard) credentialsChanged(changed func(authority.Authority) bool) {
	held := g.changed(changed)
	now := g.d.clk.Now()
	for auth, until := range held {
		wait, _, reason := g.d.pacer.ReadyIn(now, auth)
		if reason != pacer.ReasonPaused || now.UnixNano()+int64(wait) != until.UnixNano() {
			continue // the hold is over, or a longer pause (an operator's) is in force
		}
		g.d.pacer.Apply(now, pacer.Event{Type: pacer.EventResumed, Authority: auth, At: now, Reason: authHoldReason})
		g.d.log.Info().Str("authority", auth).Msg("credential changed: hold lifted")
	}
}
