// Package pacer is the HostPacer: per-authority politeness for requests to
// origins. It decides when the next request to an authority ("host:port") may
// start, and it learns from every response.
//
// It provides:
//
//   - the decision before a request start (Pacer.Acquire): cooling, a single
//     probe after a cooldown, the authority's in-flight cap, and floor spacing
//     with short-wait slot reservation;
//   - the check at the actual start (Pacer.Confirm): revocation by a cooldown
//     learned since the grant, and spacing from the other requests' actual
//     starts, so a late wake cannot bring two starts closer than the floor;
//   - spacing from the actual writes (Pacer.Sent, Options.AwaitSends): a
//     request slow to reach its connection (a dial, a TLS handshake, a
//     proxy's CONNECT) holds the next start until it is written, so the
//     floor holds between the requests as the origin receives them;
//   - learning from the response (Pacer.Done): ×2 interval escalation on
//     throttling (once per signal), decay back toward the floor with each
//     answer, to the pace learned from the origin's admissions, then a creep
//     below it (ADR 0029), cooldowns from
//     Retry-After, provider rate-limit headers or a jittered fallback, capped
//     at 600 s and never shortened;
//   - spending the budget an origin announces (RateLimit r, X-RateLimit-Remaining
//     and kin): never more requests out than remain, and a quota down to its
//     last request paced at its announced policy (RateLimit-Policy q/w, or a
//     Limit with a window) instead of run to zero (budget.go, ADR 0006);
//   - header parsing usable on its own (ParseRetryAfter, ParseFeedback,
//     ParseQuotas);
//   - the policy file (ParsePolicy, LoadPolicy): floors, in-flight caps,
//     bandwidth, first step and decay, per authority and group;
//   - state inspection (Snapshot, Counts), facts for publication
//     (Options.OnEvent) and their replay after a cold start (Apply);
//   - compressed time for load tests (Options.Scale).
//
// It does not: log (it emits events; package facts' Sink logs them),
// derive authorities from URLs (package authority does), talk to NATS or
// make HTTP requests. Every decision method takes the current instant as a
// parameter, as golang.org/x/time/rate does, so every rule is testable on a
// virtual clock; the one exception is Wait, the loop from a grant to the
// request's start, which sleeps on the clock.Clock it is given (never on the
// wall clock of its own). State is per process; coordination
// across a cluster (docs/contract.md section 8) is not part of this package.
package pacer
