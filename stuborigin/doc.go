// Package stuborigin is the throttling stub origin that mirrorworker is load
// tested against (`mirrorworker stub-origin`, and in-process from tests and the
// load test).
//
// It provides:
//
//   - deterministic objects: GET or HEAD /<anything>?size=N answers N bytes
//     derived from the path, with a strong ETag, Last-Modified and 304 answers
//     to If-None-Match / If-Modified-Since;
//   - admission before every response, keyed by caller identity (a bearer
//     token mapped by the Profile to a principal and tenant, or an anonymous
//     class hashed from the caller's /24 or /56 network and the route class),
//     with two independent token buckets per identity (burst and sustained),
//     a per-authority shared shard with a per-tenant fair share, 429
//     rate_limited for the caller's own quota and 503 capacity_exhausted for
//     shared capacity or a failed limiter store (fail closed);
//   - optional rate-limit headers (IETF RateLimit/RateLimit-Policy or
//     X-RateLimit-*) computed from the caller's own buckets;
//   - instead of the buckets, a reverse proxy's limiter, as most file trees
//     a mirror meets are limited: nginx limit_req (Profile.LimitReq: a leaky
//     bucket with burst, nodelay or delay=, 503 or 429, a fixed Retry-After
//     or none) or HAProxy's stick-table request rate (Profile.StickTable: a
//     sliding window counting refused requests too), with no rate-limit
//     headers;
//   - penalties for an identity that keeps coming early (Profile.Penalty):
//     a ban answered 429 or 403, disclosed or not, a tarpit, a growing
//     Retry-After, counted in /stats and the metrics;
//   - fault injection (limiter store down, connection reset, slow body,
//     truncated body, Retry-After format), from the profile and at run time;
//   - an admin handler with /metrics (Prometheus text format), /stats (JSON
//     per authority and identity, with a per-second timeline) and /faults.
//
// One Origin serves N authorities, one listener each; each authority is its
// own limiter shard. Time comes from an injected clock.Clock (the limiter
// store's clock), never from the client's Date header, so tests drive refill
// with clock.Fake and never sleep.
//
// It does not provide: TLS, HTTP/2, Range requests, redirects, persistence of
// limiter state across restarts, or a limiter shared between processes. It is
// a test fixture, not a production rate limiter, and not a stable public API.
package stuborigin
