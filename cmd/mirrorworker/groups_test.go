package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestProcessGroupIsOnePaceAcrossPods is issue 28's group test: three
// authorities on one host (three loopback ports), three `mirrorworker run`
// processes. Two authorities start in the group "trio" (floor 400 ms, one
// request in flight, set with `policy set --group`), the third is paced on
// its own at the pods' 300 ms floor; mid-run the third joins the group
// (`--add-members`), then the pod serving the group is SIGKILLed. As the
// origin times arrivals (kernel receive time): the group's members
// together never see a gap below the group's floor, and from the move on
// that holds for all three, the last request of the third's own pace
// included; every job is stored, byte-exact, none dead-lettered.
func TestProcessGroupIsOnePaceAcrossPods(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		perAuth     = 14
		extra       = 4 // per authority, enqueued just before the kill
		joinedExtra = 4 // per authority, enqueued once the third has joined
		podFloor    = 300 * time.Millisecond
		groupFloor  = 400 * time.Millisecond
		slack       = groupFloor / 10 // as the other process tests: a loaded machine's timing
	)
	natsURL := externalNATS(t)
	origins := []*arrivalOrigin{newArrivalOrigin(t), newArrivalOrigin(t), newArrivalOrigin(t)}
	targets := map[string]string{}
	// jobsFor adds the jobs from..to-1 of each authority to targets.
	jobsFor := func(from, to int) []string {
		var urls []string
		for i := from; i < to; i++ {
			for k, o := range origins {
				u := fmt.Sprintf("%s/obj/%d/%03d", o.srv.URL, k, i)
				targets[u] = fmt.Sprintf("obj/%d/%03d", k, i)
				urls = append(urls, u)
			}
		}
		return urls
	}
	urls := jobsFor(0, perAuth)
	a, b, c := origins[0].auth(), origins[1].auth(), origins[2].auth()
	if out, err := runPolicy(t, natsURL, "set", "--group", "trio", "--members", a+","+b,
		"--floor", groupFloor.String(), "--max-in-flight", "1", "--reason", "test: one server"); err != nil {
		t.Fatalf("policy set --group: %v\n%s", err, out)
	}
	publishURLs(t, natsURL, targets, urls)
	root := t.TempDir()
	args := func() []string {
		return workerArgs(natsURL, t.TempDir(), "--target", root, "--floor", podFloor.String(),
			"--max-in-flight", "2", "--lease-ttl", "2s", "--ack-wait", "5s", "--log-level", "info")
	}
	deps := &departureLogs{dir: t.TempDir()}
	pods := []*workerProcess{deps.start(t, args()...), deps.start(t, args()...), deps.start(t, args()...)}
	union := func(os ...*arrivalOrigin) []time.Time {
		var all []time.Time
		for _, o := range os {
			all = append(all, o.sorted()...)
		}
		sort.Slice(all, func(i, j int) bool { return all[i].Before(all[j]) })
		return all
	}
	waitFor(t, 90*time.Second, "6 requests to the group and 3 to the third authority", func() bool {
		return len(union(origins[0], origins[1])) >= 6 && len(origins[2].sorted()) >= 3
	})
	moved := time.Now()
	if out, err := runPolicy(t, natsURL, "set", "--group", "trio", "--add-members", c); err != nil {
		t.Fatalf("policy set --add-members: %v\n%s", err, out)
	}
	// The change applies in each pod when its policy watch delivers it; a
	// request its pacer started just before that was paced by the policy
	// of its time. applied is when the last pod had the change.
	applied := waitPolicyApplied(t, pods, pacer.GroupPrefix+"trio", moved)
	// The third authority's own jobs may all be done by now (alone at
	// 300 ms it outruns the group on a quick machine): jobs for it
	// published after the change make sure it has work in the group.
	joined := jobsFor(perAuth, perAuth+joinedExtra)
	publishURLs(t, natsURL, targets, joined)
	urls = append(urls, joined...)
	waitFor(t, 60*time.Second, "4 requests to the third authority after it joined", func() bool {
		return origins[2].countAfter(applied) >= 4
	})
	// More jobs for the three, so that the kill comes while the group has
	// work however fast the run went so far.
	more := jobsFor(perAuth+joinedExtra, perAuth+joinedExtra+extra)
	publishURLs(t, natsURL, targets, more)
	urls = append(urls, more...)
	partitions := jobs.DefaultPartitions
	victim := podServing(t, natsURL, pacer.GroupPrefix+"trio", partitions, pods)
	if stored := len(mirrorFiles(t, root)); stored >= len(urls) {
		t.Fatalf("all %d jobs stored before the kill; the test proves nothing", stored)
	}
	killed := time.Now()
	if _, err := pods[victim].signalAndWait(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("killed worker reported success")
	}
	pods = append(pods[:victim:victim], pods[victim+1:]...)
	// status shows the group as one row, with its floor and its source
	// (asked after the kill, so that the kill comes while jobs remain
	// however slowly status answers on a loaded machine).
	waitFor(t, 30*time.Second, "status showing the group", func() bool {
		var o bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := run(ctx, []string{"status", "--nats-url", natsURL}, noEnv, nil, &o, &o); err != nil {
			t.Logf("status: %v", err)
		}
		return strings.Contains(o.String(), "group:trio") && strings.Contains(o.String(), groupFloor.String()+" (kv)")
	})
	waitQueueEmpty(t, natsURL, root, len(urls), 150*time.Second, multiLog(pods))
	for _, p := range pods {
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("pod exit after SIGTERM: %v", err)
		}
	}
	files := mirrorFiles(t, root)
	for u, key := range targets {
		path := u[strings.Index(u[len("http://"):], "/")+len("http://"):]
		if got := string(files[key]); got != "object "+path+"\n" {
			t.Errorf("%s: stored %q, want the origin's body of %s", key, got, path)
		}
	}
	if len(files) != len(targets) {
		t.Errorf("mirror has %d files, want %d", len(files), len(targets))
	}

	// The group as the origin sees it, a and b from the start: their
	// requests were paced as one from the first.
	ab, nab := closestGap(t, "a+b", union(origins[0], origins[1]), time.Time{}, groupFloor-slack)
	// a, b and c as one from the change on, c's last request under its
	// own pace included. Judged on the instants the pods' pacers started
	// each request (their departure logs, exact and on this machine's
	// clock): a request started just before the change reached the last
	// pod may arrive after it, and the origin's clock cannot tell the two
	// apart. The origin's gaps from the change on are logged beside them.
	sentBy := readDepartures(t, deps.files)
	var sent []time.Time
	for _, o := range origins {
		for _, d := range sentBy[o.auth()] {
			sent = append(sent, d.at)
		}
	}
	sort.Slice(sent, func(i, j int) bool { return sent[i].Before(sent[j]) })
	abcSent, nabc := closestGap(t, "a+b+c as sent after the change", sent, applied, groupFloor-groupFloor/50)
	if nabc < 4 {
		t.Errorf("%d requests sent to the group after the change, want at least 4 (the pods' departure logs)", nabc)
	}
	abcArrived, _ := closestGap(nil, "", union(origins...), applied, 0)
	after := 0
	for _, u := range union(origins...) {
		if u.After(killed) {
			after++
		}
	}
	t.Logf("a+b: %d gaps, closest %s; a+b+c from the change (%.3fs after the command): %d gaps, closest %s as sent, %s as arrived; %d requests after the SIGKILL",
		nab, ab.Round(time.Millisecond), applied.Sub(moved).Seconds(), nabc, abcSent.Round(time.Millisecond), abcArrived.Round(time.Millisecond), after)
	if after == 0 {
		t.Error("no request after the SIGKILL: the group's partition did not move")
	}
	// c's own pace (300 ms) ran before the move: it must have been
	// faster than the group's, or the move proves nothing.
	cBefore := 0
	for _, u := range origins[2].sorted() {
		if u.Before(moved) {
			cBefore++
		}
	}
	if cBefore < 3 {
		t.Errorf("only %d requests to c before it joined the group", cBefore)
	}
}

// closestGap returns the closest gap between consecutive instants of
// sorted arr whose later instant is at or after from, and how many there
// are; with a non-nil t, each gap below least fails t.
func closestGap(t *testing.T, name string, arr []time.Time, from time.Time, least time.Duration) (closest time.Duration, n int) {
	closest = time.Duration(1 << 62)
	for i := 1; i < len(arr); i++ {
		if arr[i].Before(from) {
			continue
		}
		n++
		g := arr[i].Sub(arr[i-1])
		closest = min(closest, g)
		if t != nil && g < least {
			t.Errorf("%s: gap %s at %s, below %s", name, g.Round(100*time.Microsecond), arr[i].Format("15:04:05.000"), least)
		}
	}
	return closest, n
}

// waitPolicyApplied waits until every pod has logged the latest change of
// the policy key auth made since since, and returns the latest instant
// logged (each pod logs a change after applying it).
func waitPolicyApplied(t *testing.T, pods []*workerProcess, auth string, since time.Time) time.Time {
	t.Helper()
	var applied time.Time
	waitFor(t, 30*time.Second, "every pod applying the change of "+auth, func() bool {
		var rev uint64
		at := map[int]time.Time{}
		for i, p := range pods {
			for _, l := range p.log.messages("policy changed") {
				var r struct {
					Authority string    `json:"authority"`
					Revision  uint64    `json:"revision"`
					Time      time.Time `json:"time"`
				}
				if json.Unmarshal([]byte(l), &r) != nil || r.Authority != auth || r.Time.Before(since.Truncate(time.Millisecond)) {
					continue
				}
				if r.Revision > rev {
					rev, at = r.Revision, map[int]time.Time{}
				}
				if r.Revision == rev {
					at[i] = r.Time
				}
			}
		}
		if len(at) < len(pods) {
			return false
		}
		for _, x := range at {
			if x.After(applied) {
				applied = x
			}
		}
		return true
	})
	// Logged times are to the millisecond, truncated.
	return applied.Add(time.Millisecond)
}
