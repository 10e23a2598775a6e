package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/deadletter"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// cmdDLQ is `mirrorworker dlq list|show|requeue`.
func cmdDLQ(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, "usage: mirrorworker dlq list    [--tenant T] [--authority A] [--reason R] [--since D | --from-time T] [--until T] [--output table|json]")
		fmt.Fprintln(stderr, "       mirrorworker dlq show    SEQ...")
		fmt.Fprintln(stderr, "       mirrorworker dlq requeue [--dry-run] (SEQ... | filters as for list | --all)")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Dead letters are in stream "+jobs.DLQStream+"; SEQ is a record's sequence there (the first column of list).")
		fmt.Fprintln(stderr, "A replay's are in "+replay.DeadLetterStream+": add --replays to each command to read them.")
		fmt.Fprintln(stderr, "Run 'mirrorworker dlq <command> -h' for its flags.")
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) == 0 {
			return usageError{"dlq: missing command: list, show or requeue"}
		}
		return nil
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "list", "show", "requeue":
	default:
		usage()
		return usageError{fmt.Sprintf("dlq: unknown command %q: want list, show or requeue", sub)}
	}
	var f dlqFlags
	fs := newFlagSet("dlq "+sub, stderr)
	f.register(fs, sub)
	fs.Usage = func() {
		usage()
		fmt.Fprintln(stderr)
		fmt.Fprintf(stderr, "Flags of 'dlq %s':\n", sub)
		printFlags(fs)
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	q, seqs, err := f.check(sub, fs.Args(), time.Now())
	if err != nil {
		return err
	}
	f.nats.markGiven(fs, getenv)
	nc, err := f.nats.dial(ctx, "mirrorworker-dlq", deadletter.StreamOf(f.replays), stderr)
	if err != nil {
		return fmt.Errorf("dlq: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("dlq: %w", err)
	}
	switch sub {
	case "list":
		recs, err := deadletter.List(ctx, js, q)
		if err != nil {
			return fmt.Errorf("dlq list: %w", err)
		}
		return writeRecords(stdout, f.output, recs)
	case "show":
		var recs []deadletter.Record
		for _, s := range seqs {
			r, err := deadletter.Get(ctx, js, s, f.replays)
			if err != nil {
				return fmt.Errorf("dlq show: %w", err)
			}
			recs = append(recs, r)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		for _, r := range recs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	return requeue(ctx, js, &f, q, seqs, stdout, stderr)
}

// dlqFlags are the flags of the dlq commands.
type dlqFlags struct {
	nats        natsFlags
	tenants     listFlag
	authorities listFlag
	reasons     listFlag
	since       string
	fromTime    string
	until       string
	limit       int
	output      string
	dryRun      bool
	all         bool
	maxGen      int
	replays     bool
}

func (f *dlqFlags) register(fs *flag.FlagSet, sub string) {
	f.nats.registerClient(fs, nil, "connect-timeout")
	fs.BoolVar(&f.replays, "replays", false, "the dead letters of replays (stream "+replay.DeadLetterStream+") instead of the live pipeline's ("+jobs.DLQStream+")")
	if sub == "show" {
		return
	}
	fs.Var(&f.tenants, "tenant", "only this `tenant`'s dead letters (repeatable, or comma-separated)")
	fs.Var(&f.authorities, "authority", "only the dead letters of this `origin`, as a URL or host:port (repeatable, or comma-separated)")
	fs.Var(&f.reasons, "reason", "only dead letters with this reason `code`, e.g. http_404, budget_exhausted (repeatable, or comma-separated)")
	fs.StringVar(&f.since, "since", "", "only dead letters of the last `duration` (90m, 24h, 7d), as replay's --since")
	fs.StringVar(&f.fromTime, "from-time", "", "only dead letters stored at or after this RFC 3339 time")
	fs.StringVar(&f.until, "until", "", "only dead letters stored before this RFC 3339 time")
	fs.IntVar(&f.limit, "limit", 0, "at most this many, the oldest first (0: all)")
	if sub == "list" {
		fs.StringVar(&f.output, "output", "table", "output: table, or json (one JSON object per line)")
		return
	}
	fs.BoolVar(&f.dryRun, "dry-run", false, "print what would be requeued and publish nothing")
	fs.BoolVar(&f.all, "all", false, "requeue every dead letter the filters select even when no filter is given")
	fs.IntVar(&f.maxGen, "max-generation", deadletter.DefaultMaxGeneration, "refuse a job already requeued this many times")
}

// check validates the flags and arguments: the query, and the sequences
// given as arguments (show, requeue).
func (f *dlqFlags) check(sub string, args []string, now time.Time) (deadletter.Query, []uint64, error) {
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	var q deadletter.Query
	var seqs []uint64
	for _, a := range args {
		n, err := strconv.ParseUint(a, 10, 64)
		if err != nil || n == 0 {
			bad("%q: want a dead letter's sequence number (the SEQ column of 'dlq list')", a)
			continue
		}
		seqs = append(seqs, n)
	}
	switch {
	case sub == "list" && len(args) > 0:
		bad("list takes no arguments; use 'dlq show SEQ' for one record")
	case sub == "show" && len(args) == 0:
		bad("show needs one or more SEQ arguments")
	}
	q.Replays = f.replays
	q.Filter.Tenants = f.tenants
	for _, s := range f.authorities {
		a, err := replay.ParseAuthority(s)
		if err != nil {
			bad("%s", strings.TrimPrefix(err.Error(), replay.ErrFilter.Error()+": "))
			continue
		}
		q.Filter.Authorities = append(q.Filter.Authorities, a)
	}
	if _, err := q.Subjects(); err != nil {
		bad("%s", strings.TrimPrefix(err.Error(), replay.ErrFilter.Error()+": "))
	}
	q.Reasons = f.reasons
	f.window(&q, now, bad)
	if f.limit < 0 {
		bad("--limit %d: want 0 (all) or more", f.limit)
	}
	q.Limit = f.limit
	if sub == "list" && f.output != "table" && f.output != "json" {
		bad("--output %q: want table or json", f.output)
	}
	filtered := len(f.tenants)+len(f.authorities)+len(f.reasons) > 0 || f.since != "" || f.fromTime != "" || f.until != ""
	if sub == "requeue" {
		switch {
		case len(seqs) > 0 && (filtered || f.all):
			bad("give SEQ arguments or filters, not both")
		case len(args) == 0 && !filtered && !f.all:
			bad("requeue needs SEQ arguments, a filter (--reason, --tenant, --authority, --since ...), or --all")
		}
		if f.maxGen < 1 {
			bad("--max-generation %d: want at least 1", f.maxGen)
		}
	}
	if len(errs) > 0 {
		return q, nil, usageError{"dlq " + sub + ": " + strings.Join(errs, "; ")}
	}
	return q, seqs, nil
}

// window sets q's time bounds from --since, --from-time and --until.
func (f *dlqFlags) window(q *deadletter.Query, now time.Time, bad func(string, ...any)) {
	since, err := replay.ParseSince(f.since)
	switch {
	case f.since == "":
	case err != nil:
		bad("--since %q: want a duration, like 90m, 24h or 7d", f.since)
	case since <= 0:
		bad("--since %s: want a positive duration", f.since)
	case f.fromTime != "":
		bad("--since and --from-time: give one")
	default:
		q.Since = now.Add(-since)
	}
	switch {
	case f.since != "":
	case f.fromTime != "":
		t, err := time.Parse(time.RFC3339, f.fromTime)
		if err != nil {
			bad("--from-time %q: want an RFC 3339 time such as 2026-11-29T08:00:00Z", f.fromTime)
		}
		q.Since = t
	}
	if f.until != "" {
		t, err := time.Parse(time.RFC3339, f.until)
		if err != nil {
			bad("--until %q: want an RFC 3339 time such as 2026-11-29T08:00:00Z", f.until)
		}
		q.Until = t
	}
}

func writeRecords(w io.Writer, output string, recs []deadletter.Record) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		for _, r := range recs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tTENANT\tAUTHORITY\tREASON\tSTATUS\tATTEMPTS\tREQUEUED\tJOB\tURL")
	for _, r := range recs {
		d := r.Record
		status := "-"
		if d.LastStatus != 0 {
			status = strconv.Itoa(d.LastStatus)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.Seq, r.Time.Format(time.RFC3339), dash(d.Tenant), dash(d.Authority),
			d.Reason, status, r.Requests(), r.Requeued, dash(d.JobID), dash(jobURL(d)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d dead letters\n", len(recs))
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// jobURL is the job's URL without its query string, as logs show URLs;
// a delete job's is marked "delete ", so that a failed delete is not read
// as a failed fetch.
func jobURL(d jobs.DeadLetter) string {
	var j struct {
		URL string `json:"url"`
		Op  string `json:"op"`
	}
	if json.Unmarshal(d.Job, &j) != nil {
		return ""
	}
	u, _, _ := strings.Cut(j.URL, "?")
	if j.Op == jobs.OpDelete && u != "" {
		u = jobs.OpDelete + " " + u
	}
	return u
}

func requeue(ctx context.Context, js jetstream.JetStream, f *dlqFlags, q deadletter.Query, seqs []uint64, stdout, stderr io.Writer) error {
	var recs []deadletter.Record
	if len(seqs) > 0 {
		for _, s := range seqs {
			r, err := deadletter.Get(ctx, js, s, f.replays)
			if err != nil {
				return fmt.Errorf("dlq requeue: %w", err)
			}
			recs = append(recs, r)
		}
	} else {
		var err error
		if recs, err = deadletter.List(ctx, js, q); err != nil {
			return fmt.Errorf("dlq requeue: %w", err)
		}
	}
	var requeued, duplicates, refused int
	for _, r := range recs {
		rq, err := deadletter.Prepare(r, f.maxGen)
		if err != nil {
			refused++
			fmt.Fprintln(stderr, err)
			continue
		}
		if f.dryRun {
			fmt.Fprintf(stdout, "would requeue dead letter %d (%s) as job %s: %s\n", r.Seq, r.Record.Reason, rq.Job.ID, rq.Job.URL)
			requeued++
			continue
		}
		ack, err := deadletter.Publish(ctx, js, rq)
		if errors.Is(err, deadletter.ErrNotMarked) {
			fmt.Fprintf(stderr, "warning: %v ('dlq list' shows one requeue too few)\n", err)
			err = nil
		}
		if err != nil {
			return fmt.Errorf("dlq requeue: %w (%d requeued before it)", err, requeued)
		}
		requeued++
		if ack.Duplicate {
			duplicates++
		}
		fmt.Fprintf(stdout, "requeued dead letter %d (%s) as job %s (%s sequence %d)\n", r.Seq, r.Record.Reason, rq.Job.ID, jobs.JobsStream, ack.Sequence)
	}
	switch {
	case f.dryRun:
		fmt.Fprintf(stdout, "dry run: %d would be requeued, %d refused; nothing published\n", requeued, refused)
	case duplicates > 0:
		fmt.Fprintf(stdout, "%d requeued (%d were requeued already within the duplicate window and not published again), %d refused\n", requeued, duplicates, refused)
	default:
		fmt.Fprintf(stdout, "%d requeued, %d refused\n", requeued, refused)
	}
	if refused > 0 {
		return errors.New("dlq requeue: some dead letters were refused (see above)")
	}
	return nil
}
