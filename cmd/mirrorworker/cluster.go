package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/cluster"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/replay"
	"github.com/mirrorworker/mirrorworker/worker"
)

// opFlags are the flags of pause, resume and status.
type opFlags struct {
	nats      natsFlags
	authority string
	stderr    io.Writer
}

func (o *opFlags) register(fs *flag.FlagSet, authHelp string) {
	// --nats-timeout was these commands' name for --nats-connect-timeout.
	o.nats.registerClient(fs, nil, "nats-timeout")
	fs.StringVar(&o.authority, "authority", "", authHelp)
}

// timeout bounds each request to NATS.
func (o *opFlags) timeout() time.Duration { return o.nats.timeout }

// connect reaches NATS; stream is the one the command reads or writes,
// for the line that says which server is used.
func (o *opFlags) connect(ctx context.Context, stream string) (jetstream.JetStream, func(), error) {
	nc, err := o.nats.dial(ctx, "mirrorworker-operator", stream, o.stderr)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, func() { nc.Drain() }, nil
}

// parse sets fs's usage (the usage line, then the description lines, then
// the flags), parses args and reads --authority, which is required unless
// optional. Errors are usage errors that name the command.
func (o *opFlags) parse(fs *flag.FlagSet, args []string, getenv func(string) string, stderr io.Writer, optional bool, usage ...string) (string, error) {
	fs.Usage = func() {
		for i, l := range usage {
			fmt.Fprintln(stderr, l)
			if i == 0 {
				fmt.Fprintln(stderr)
			}
		}
		fmt.Fprintln(stderr)
		printFlags(fs)
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return "", err
	}
	o.stderr = stderr
	o.nats.markGiven(fs, getenv)
	name := strings.TrimPrefix(fs.Name(), "mirrorworker ")
	if o.authority == "" {
		if optional {
			return "", nil
		}
		return "", usageError{name + ": --authority is required (host:port, or a URL)"}
	}
	a, err := replay.ParseAuthority(o.authority)
	if err != nil {
		return "", usageError{name + ": " + strings.TrimPrefix(err.Error(), replay.ErrFilter.Error()+": ")}
	}
	return a.String(), nil
}

// cmdPause is `mirrorworker pause --authority A --for D`.
func cmdPause(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	var o opFlags
	fs := newFlagSet("pause", stderr)
	o.register(fs, "authority to pause: host:port, or a URL (https://h/x means h:443)")
	forD := fs.Duration("for", 0, "how long to pause it (required; not capped: it is your decision)")
	reason := fs.String("reason", "", "why, for the logs and status")
	auth, err := o.parse(fs, args, getenv, stderr, false,
		"usage: mirrorworker pause --authority HOST:PORT --for DURATION [--reason TEXT]",
		"Stops every worker of the cluster from sending requests to one authority, within a second,",
		"until the time is up or 'mirrorworker resume'. Its jobs wait (parked), none is lost.")
	if err != nil {
		return err
	}
	if *forD <= 0 {
		return usageError{"pause: --for is required and must be positive (e.g. --for 30m)"}
	}
	now := time.Now()
	ev := pacer.Event{Type: pacer.EventPaused, Authority: auth, At: now, Until: now.Add(*forD), Reason: *reason}
	if err := publishOperatorFact(ctx, &o, ev); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "paused %s until %s (%s)\n", auth, ev.Until.UTC().Format(time.RFC3339), *forD)
	return nil
}

// cmdResume is `mirrorworker resume --authority A`.
func cmdResume(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	var o opFlags
	fs := newFlagSet("resume", stderr)
	o.register(fs, "authority to resume: host:port, or a URL")
	auth, err := o.parse(fs, args, getenv, stderr, false,
		"usage: mirrorworker resume --authority HOST:PORT",
		"Ends an operator's pause of an authority on every worker. A cooldown the origin asked",
		"for (429, Retry-After) is not an operator's pause and stays in force.")
	if err != nil {
		return err
	}
	if err := publishOperatorFact(ctx, &o, pacer.Event{Type: pacer.EventResumed, Authority: auth, At: time.Now()}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "resumed %s\n", auth)
	return nil
}

func publishOperatorFact(ctx context.Context, o *opFlags, ev pacer.Event) error {
	js, closeConn, err := o.connect(ctx, jobs.EventsStream)
	if err != nil {
		return err
	}
	defer closeConn()
	pctx, cancel := context.WithTimeout(ctx, o.timeout())
	defer cancel()
	return facts.PublishOperator(pctx, js, ev)
}

// statusRow is one authority in `mirrorworker status`.
type statusRow struct {
	worker.AuthorityStatus
	Pod       string `json:"pod"`
	Partition int    `json:"partition"`
}

// cmdStatus is `mirrorworker status [--authority A]`.
func cmdStatus(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	var o opFlags
	fs := newFlagSet("status", stderr)
	o.register(fs, "show only this authority (host:port, or a URL)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	only, err := o.parse(fs, args, getenv, stderr, true,
		"usage: mirrorworker status [--authority HOST:PORT] [--json]",
		"Shows the live pods, which partitions each serves, and every authority that is not idle:",
		"its state, cooldown or pause deadline, interval, requests in flight, jobs queued in memory",
		"and jobs parked, and the pod that serves it; then each fetch in flight: its URL, bytes received",
		"of the expected size, average rate, time elapsed and left.")
	if err != nil {
		return err
	}
	js, closeConn, err := o.connect(ctx, jobs.PodsBucket+" and "+jobs.LeasesBucket)
	if err != nil {
		return err
	}
	defer closeConn()
	rctx, cancel := context.WithTimeout(ctx, o.timeout())
	defer cancel()
	pods, err := readPods(rctx, js)
	if err != nil {
		return err
	}
	leases, partitions, err := readLeases(rctx, js)
	if err != nil {
		return err
	}
	rows := statusRows(pods, leases, partitions, only)
	replays, err := readReplays(rctx, js)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Pods        []worker.PodStatus `json:"pods"`
			Leases      map[int]string     `json:"leases"`
			Authorities []statusRow        `json:"authorities"`
			Replays     []jobs.ReplayRun   `json:"replays,omitempty"`
		}{pods, leases, rows, replays})
	}
	if err := writeStatus(stdout, pods, leases, partitions, rows, time.Now()); err != nil {
		return err
	}
	if err := writeFetches(stdout, pods); err != nil {
		return err
	}
	return writeReplays(stdout, replays, pods, time.Now())
}

// statusRows is one row per authority, sorted, of those only selects (""
// for all). Every pod knows every authority's cooldowns and pauses (they
// share pacer facts), but only the lease holder of its partition serves
// it: its view wins, and the jobs any pod still holds or has parked are
// added up. An authority asked for by name that no pod knows is idle.
func statusRows(pods []worker.PodStatus, leases map[int]string, partitions int, only string) []statusRow {
	byAuth := map[string]*statusRow{}
	for _, ps := range pods {
		for _, a := range ps.Authorities {
			if only != "" && a.Authority != only {
				continue
			}
			part := jobs.Partition(authority.KeyOf(a.Authority), partitions)
			r := byAuth[a.Authority]
			if r == nil {
				r = &statusRow{AuthorityStatus: a, Pod: leases[part], Partition: part}
				r.Queued, r.Parked, r.InFlight = 0, 0, 0
				byAuth[a.Authority] = r
			}
			if ps.Pod == leases[part] {
				q, pk, in := r.Queued, r.Parked, r.InFlight
				r.AuthorityStatus = a
				r.Queued, r.Parked, r.InFlight = q, pk, in
			}
			r.Queued += a.Queued
			r.Parked += a.Parked
			r.InFlight += a.InFlight
		}
	}
	var rows []statusRow
	for _, r := range byAuth {
		rows = append(rows, *r)
	}
	if only != "" && len(rows) == 0 {
		p := jobs.Partition(authority.KeyOf(only), partitions)
		rows = append(rows, statusRow{AuthorityStatus: worker.AuthorityStatus{State: pacer.State{Authority: only, State: pacer.StateIdle}},
			Pod: leases[p], Partition: p})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Authority < rows[j].Authority })
	return rows
}

// writeStatus prints the pods table and the authorities table.
func writeStatus(w io.Writer, pods []worker.PodStatus, leases map[int]string, partitions int, rows []statusRow, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// COPIED: jobs stored by a copy of the same bytes under another key,
	// with no request, since the pod started (ADR 0034).
	fmt.Fprintln(tw, "POD\tPARTITIONS\tHELD\tCOPIED\tUPDATED")
	for _, ps := range pods {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s ago\n", ps.Pod, len(ps.Partitions), ps.Held, ps.Copied, now.Sub(ps.Updated).Round(100*time.Millisecond))
	}
	if free := partitions - len(leases); free > 0 {
		fmt.Fprintf(tw, "(unowned)\t%d\t\t\t\n", free)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	writeDeleteLimits(w, pods, now)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "AUTHORITY\tSTATE\tUNTIL\tINTERVAL\tFLOOR (POLICY)\tIN FLIGHT\tBANDWIDTH\tQUEUED\tPARKED\tSERVED BY")
	for _, r := range rows {
		until := "-"
		switch {
		case !r.PausedUntil.IsZero() && r.PauseReason != "":
			until = r.PausedUntil.UTC().Format(time.RFC3339) + " (paused: " + r.PauseReason + ")"
		case !r.PausedUntil.IsZero():
			until = r.PausedUntil.UTC().Format(time.RFC3339) + " (paused)"
		case !r.CooldownUntil.IsZero():
			until = r.CooldownUntil.UTC().Format(time.RFC3339)
		case !r.BackoffUntil.IsZero():
			until = fmt.Sprintf("%s (backoff, %d failures)", r.BackoffUntil.UTC().Format(time.RFC3339), r.Failures)
		}
		floor, bw := r.Floor.String(), describeBandwidth(r.Bandwidth)
		switch {
		case r.MaxInFlight == 0: // no pod tracks it: see 'mirrorworker policy list'
			floor, bw = "-", "-"
		case r.PolicySource != "":
			floor += " (" + r.PolicySource + ")"
		}
		if r.MaxInFlight != 0 {
			floor += describeConvergence(r.State)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%d\t%d\t%s\n", r.Authority, r.State.State, until, r.Interval, floor,
			r.InFlight, r.MaxInFlight, bw, r.Queued, r.Parked, r.Pod)
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(every authority idle)\t\t\t\t\t\t\t\t\t")
	}
	return tw.Flush()
}

func readPods(ctx context.Context, js jetstream.JetStream) ([]worker.PodStatus, error) {
	kv, err := js.KeyValue(ctx, jobs.PodsBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w (no worker has run on this NATS)", jobs.PodsBucket, err)
	}
	out, err := jobs.Entries[worker.PodStatus](ctx, js, kv)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	return out, nil
}

// readLeases returns the owner of every leased partition and the count of
// partitions.
func readLeases(ctx context.Context, js jetstream.JetStream) (map[int]string, int, error) {
	n := jobs.DefaultPartitions
	if s, err := js.Stream(ctx, jobs.JobsStream); err == nil {
		if have, err := jobs.PartitionsOf(s.CachedInfo().Config); err == nil {
			n = have
		}
	}
	kv, err := js.KeyValue(ctx, jobs.LeasesBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return map[int]string{}, 0, nil // pods of the shared consumer (--partitions 0) only: no partitions
	} else if err != nil {
		return nil, n, fmt.Errorf("bucket %s: %w", jobs.LeasesBucket, err)
	}
	out := map[int]string{}
	for p := range n {
		e, err := kv.Get(ctx, jobs.LeaseKey(p))
		if err != nil {
			continue
		}
		var l cluster.Lease
		if json.Unmarshal(e.Value(), &l) == nil {
			out[p] = l.Pod
		}
	}
	return out, n, nil
}

// describeConvergence is what status adds beside an authority's floor: the
// escalation's first step in force when it is not the contract's 2 s (a
// policy set it, or a pace learned from the origin shortened it), the decay
// when a policy changed it, and the learned pace (ADR 0029); empty when none
// of them is worth a word.
func describeConvergence(st pacer.State) string {
	var s string
	if st.FirstStep != 0 && time.Duration(st.FirstStep) != pacer.FirstStep {
		s += ", first step " + st.FirstStep.String()
	}
	if st.Decay != 0 && st.Decay != pacer.DefaultDecay {
		s += fmt.Sprintf(", decay %d", st.Decay)
	}
	if st.Pace != 0 {
		s += ", pace " + st.Pace.String()
	}
	return s
}

// writeDeleteLimits says, for each pod whose delete limit holds deletes
// back, since when and how to raise it: a producer gone wrong shows here
// before it costs the mirror more than a minute's worth of objects.
func writeDeleteLimits(w io.Writer, pods []worker.PodStatus, now time.Time) {
	for _, ps := range pods {
		d := ps.Deletes
		if d.ReachedSince == nil {
			continue
		}
		fmt.Fprintf(w, "delete limit reached on %s for %s: %d deletes in the last minute (--max-deletes-per-minute %d); "+
			"further deletes wait in the stream and fetches go on. Expected deletes: raise --max-deletes-per-minute (0: no limit). "+
			"Unexpected: stop their producer.\n", ps.Pod, now.Sub(*d.ReachedSince).Round(time.Second), d.LastMinute, d.Limit)
	}
}
