// Package loadtest runs the whole system against the throttling stub origin,
// once per politeness strategy, and reports what the origin saw: the
// `mirrorworker loadtest` command.
//
// It provides Run (one load test: per strategy a fresh embedded JetStream,
// an in-process stub origin with one listener per authority, W workers, N
// jobs), the load-test profile format (a stub origin profile plus the
// politeness policy and time scale the strategies run with), the Report,
// written as report.json and a self-contained report.html, and the
// reading of the departure logs the pods write (internal/departures).
//
// The HostPacer runs as W `mirrorworker run` processes (pods) on the
// partitioned cluster layout, as a deployment runs it, unless
// Options.InProcess; the other strategies are not what `run` runs and are
// W in-process worker instances, each with its own pacer state.
//
// It does not provide: a benchmark of any single package, runs against real
// origins, or per-worker heap figures (in-process workers share the process
// with the origin and JetStream, so the report gives the process's; pods
// report their CPU time and peak RSS). It is a test harness, not a stable
// public API.
package loadtest
