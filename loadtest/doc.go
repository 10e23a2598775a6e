// Package loadtest runs the whole system against the throttling stub origin,
// once per politeness strategy, and reports what the origin saw: the
// `mirrorworker loadtest` command.
//
// It provides Run (one load test: per strategy a fresh embedded JetStream,
// an in-process stub origin with one listener per authority, W worker
// instances each with its own pacer state, N jobs), the load-test profile
// format (a stub origin profile plus the politeness policy and time scale
// the strategies run with), and the Report, written as report.json and a
// self-contained report.html.
//
// It does not provide: a benchmark of any single package, runs against real
// origins, or per-worker CPU and memory figures (the workers share the
// process with the origin and JetStream, so the report gives the process's).
// It is a test harness, not a stable public API.
package loadtest
