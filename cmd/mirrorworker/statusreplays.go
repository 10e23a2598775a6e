package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// readReplays returns the replays handing their jobs to the pods, from
// jobs.ReplaysBucket; none when it does not exist.
func readReplays(ctx context.Context, js jetstream.JetStream) ([]jobs.ReplayRun, error) {
	kv, err := js.KeyValue(ctx, jobs.ReplaysBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", jobs.ReplaysBucket, err)
	}
	runs, err := readReplayRuns(ctx, js, kv)
	// A replay that paced alone and is over leaves its entry to expire
	// (jobs.ReplayRun.Ended): it is no replay running.
	out := runs[:0]
	for _, r := range runs {
		if r.Ended.IsZero() {
			out = append(out, r)
		}
	}
	return out, err
}

func readReplayRuns(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) ([]jobs.ReplayRun, error) {
	out, err := jobs.Entries[jobs.ReplayRun](ctx, js, kv)
	if err != nil {
		return nil, fmt.Errorf("list replays: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out, nil
}

// writeReplays prints each replay running: done, whose pace it keeps (the
// pods', which grant its starts, or its own with no pod; docs/adr/0031),
// the ETA, the busiest authorities (and, for a replay of an earlier
// version that hands its jobs to the pods, the jobs in their queues); then
// the requests the pods started in the last minute by class, and the rule
// that puts live jobs first.
func writeReplays(w io.Writer, runs []jobs.ReplayRun, pods []worker.PodStatus, now time.Time) error {
	if len(runs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "REPLAY\tTARGET\tDONE\tPACE\tETA\tUPDATED")
	for _, r := range runs {
		eta := "-"
		if r.ETA > 0 {
			eta = r.ETA.String()
		}
		queued := "the pods' (they grant its starts)"
		switch {
		case r.Waiting > 0:
			queued = fmt.Sprintf("the pods' (%d in their queues)", r.Waiting)
		case r.Alone && r.WaitingFor != "":
			queued = "- (no pod: it waits for replay " + r.WaitingFor + ", which paces alone; replays with no pod run one at a time)"
		case r.Alone && !r.PodsGone.IsZero():
			queued = "- (no pod answers grants since " + r.PodsGone.Local().Format("15:04:05") + ": it paces alone with the cluster's last facts until one starts)"
		case r.Alone:
			queued = "- (no pod: it paces its own requests until one starts)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\t%s ago\n", r.Run, r.Target, r.Done, r.Jobs, queued, eta, now.Sub(r.Updated).Round(100*time.Millisecond))
		var auths []string
		for i, a := range r.Authorities {
			if i == 5 {
				auths = append(auths, fmt.Sprintf("+%d more", len(r.Authorities)-i))
				break
			}
			auths = append(auths, fmt.Sprintf("%s %d done, %d queued, %d to hand over", a.Authority, a.Done, a.Waiting, a.Held))
		}
		if len(auths) > 0 {
			fmt.Fprintf(tw, "  %s\t\t\t\t\t\n", strings.Join(auths, "; "))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var sum worker.ClassRequests
	for _, p := range pods {
		sum.Live += p.Requests.Live
		sum.Replay += p.Requests.Replay
	}
	share := "none started"
	if n := sum.Live + sum.Replay; n > 0 {
		share = fmt.Sprintf("%d live, %d replay: %.0f%% replay", sum.Live, sum.Replay, 100*float64(sum.Replay)/float64(n))
	}
	_, err := fmt.Fprintf(w, "Requests in the last minute, all pods: %s (a replay's own requests are not counted here). Replays go after live jobs: while live jobs of an authority wait, replays get at most 1 request in %d.\n",
		share, worker.LiveFirstRun+1)
	return err
}
