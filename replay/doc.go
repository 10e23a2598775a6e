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
//   - the hand-over to live pods (Handover, docs/adr/0025), at once when pods
//     are live, or mid-way (Alone) when one starts while the replay paces
//     its own requests.
//
// It does not fetch, store or pace: a replay runs the same worker, pacer and
// mirror target as live jobs (cmd/mirrorworker wires them), so it is never a
// politeness bypass. It publishes no new jobs: the replayed jobs are the
// messages already in the stream, and a hand-over's copies are theirs. Like every package in this module it is
// not a stable public API.
package replay
