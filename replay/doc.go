// Package replay re-drives the jobs of MIRROR_JOBS that are already in
// JetStream into a mirror target again. (Restoring a fresh pacer from the
// pacer facts of MIRROR_EVENTS at a cold start is package facts' Restore.)
//
// It provides:
//
//   - job replay (Run): an ephemeral consumer on MIRROR_JOBS from the
//     beginning, a stream sequence or a time (Start), narrowed by tenant and
//     authority (Filter), handed to the caller's worker; Run returns once
//     every job stored up to the stream's last sequence at the start has been
//     handled, reporting progress on the way;
//   - dry runs (Count): how many jobs a replay would re-drive, per authority
//     key, without fetching anything;
//   - pacing alone and giving way to pods (Alone): a replay that finds no
//     pod paces its own requests until one starts, then goes on in the
//     pods' pace, each start granted by the owner (package grant's Paced,
//     docs/adr/0031), as does a replay that finds pods at once; if the pods
//     all go and none answers, it paces alone again (PodsRunning).
//
// It does not fetch, store or pace: a replay runs the same worker, fetch
// client and mirror target as live jobs, and the pods' pacers grant its
// starts (cmd/mirrorworker wires them), so it is never a politeness bypass.
// It publishes no new jobs: the replayed jobs are the messages already in
// the stream. Like every package in this module it is not a stable public
// API.
package replay
