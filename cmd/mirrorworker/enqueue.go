package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go/jetstream"
)

// enqueueWindow bounds the asynchronous publishes awaiting their ack.
const enqueueWindow = 256

// jobFlags describe the job of a URL argument. They are read from the
// command line only: MIRRORWORKER_TARGET, for one, configures the worker's
// mirror target and must not become every enqueued job's target key.
var jobFlags = []string{"tenant", "kind", "target", "id", "delete"}

// enqueueFlags are the flags of `mirrorworker enqueue`.
type enqueueFlags struct {
	nats                 natsFlags
	tenant, kind, target string
	id                   string
	delete               bool // the URL arguments are delete jobs
	dryRun               bool
	replicas             int
	inputs               []string // URL arguments and "-", in order
	urls                 int      // URL arguments
	stdin                bool     // "-" given, or no argument
}

func (f *enqueueFlags) register(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("enqueue", stderr)
	// --connect-timeout meant NATS here and the origin in run and replay;
	// the old spelling keeps working for scripts that use it.
	f.nats.registerClient(fs, nil, "connect-timeout")
	fs.StringVar(&f.tenant, "tenant", "", "`tenant` of the URL arguments (default \"default\"); command line only")
	fs.StringVar(&f.kind, "kind", "", "`kind` of the URL arguments: artifact (default), metadata or companion; command line only")
	fs.StringVar(&f.target, "target", "", "mirror target `key` of the single URL argument (default <host>/<path>, with ':' as '_': 127.0.0.1_8000/a.txt); required for a URL with a query string; command line only")
	fs.StringVar(&f.id, "id", "", "job `id` of the single URL argument (default: derived from the URL and target, so the same job enqueued twice within the stream's duplicate window is one job); command line only")
	fs.BoolVar(&f.delete, "delete", false, "enqueue delete jobs: remove from the mirror the key each URL argument's fetch stores into (its default key, or --target), leaving a tombstone; the URL is needed because its authority's queue orders the key's fetches and deletes. Command line only")
	fs.BoolVar(&f.dryRun, "dry-run", false, "validate only; connect to nothing and publish nothing")
	registerReplicasFlag(fs, &f.replicas)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mirrorworker enqueue [flags] [URL...]")
		fmt.Fprintln(stderr, "       mirrorworker enqueue [flags] < jobs.jsonl   (one JSON job per line, or '-' as an argument)")
		fmt.Fprintln(stderr, "       mirrorworker enqueue --delete [flags] URL...   (remove the keys these URLs are stored under)")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Flags may come before or after the URLs:")
		fmt.Fprintln(stderr, "  mirrorworker enqueue 'https://go.dev/VERSION?m=text' --target go/VERSION")
		fmt.Fprintln(stderr)
		printFlags(fs)
	}
	return fs
}

// check validates the flags and arguments after parseFlags.
func (f *enqueueFlags) check(fs *flag.FlagSet, getenv func(string) string) error {
	f.nats.markGiven(fs, getenv)
	var bad []string
	checkReplicas(func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }, f.replicas)
	if len(bad) > 0 {
		return usageError{"enqueue: " + bad[0]}
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { onCommandLine[fl.Name] = true })
	for _, name := range jobFlags {
		if !onCommandLine[name] {
			_ = fs.Lookup(name).Value.Set("") // undo a value taken from the environment
		}
	}
	f.inputs = fs.Args()
	if len(f.inputs) == 0 {
		f.inputs = []string{"-"}
	}
	stdinCount := 0
	for _, in := range f.inputs {
		if in == "-" {
			stdinCount++
		} else {
			f.urls++
		}
	}
	f.stdin = stdinCount > 0
	switch {
	case stdinCount > 1:
		return usageError{"enqueue: '-' (standard input) may be given once"}
	case f.stdin && (f.tenant != "" || f.kind != "" || f.target != "" || f.id != "" || f.delete):
		return usageError{"enqueue: --tenant, --kind, --target, --id and --delete apply to URL arguments, not to JSON lines (put the fields in the JSON: \"op\": \"delete\", \"v\": 2 for a delete)"}
	case f.target != "" && f.urls != 1:
		return usageError{fmt.Sprintf("enqueue: --target needs exactly one URL argument, got %d (enqueue the URLs one by one, or as JSON lines with a \"target\" each)", f.urls)}
	case f.id != "" && f.urls != 1:
		return usageError{fmt.Sprintf("enqueue: --id needs exactly one URL argument, got %d", f.urls)}
	}
	return nil
}

// argJob is the JSON job of a URL argument.
func (f *enqueueFlags) argJob(url string) ([]byte, error) {
	fields := map[string]string{"url": url}
	for k, v := range map[string]string{"tenant": f.tenant, "kind": f.kind, "target": f.target, "id": f.id} {
		if v != "" {
			fields[k] = v
		}
	}
	if f.delete {
		fields["op"] = jobs.OpDelete
	}
	return json.Marshal(fields)
}

// cmdEnqueue publishes jobs: `mirrorworker enqueue [flags] [URL...]`, or JSON
// lines on stdin when no URL is given (or "-" is). Every job is validated;
// valid ones are published, and each rejected one is named on stderr
// ("line 3: url: ..."), which makes the command fail. URL arguments are
// validated before anything connects: a typo is reported as a typo even
// when NATS is not there.
func cmdEnqueue(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	var f enqueueFlags
	fs := f.register(stderr)
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	if err := f.check(fs, getenv); err != nil {
		return err
	}
	if !f.dryRun {
		// Which server comes first, before what is said about the jobs.
		if err := f.nats.resolve(); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		f.nats.announce(stderr, jobs.JobsStream)
	}
	e := &enqueuer{stderr: stderr, dryRun: f.dryRun}
	valid, err := e.validateArgs(&f)
	if err != nil {
		return err
	}
	if !f.dryRun && (f.stdin || valid > 0) {
		js, closeConn, err := connectJobs(ctx, &f.nats, f.replicas, stderr)
		if err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		defer closeConn()
		e.js = js
		e.privateOK = podsAllowPrivate(ctx, js)
	}
	if err := e.publishInputs(ctx, &f, stdin); err != nil {
		return err
	}
	if err := e.flush(ctx); err != nil {
		return err
	}
	if e.duplicates > 0 {
		e.window = duplicateWindow(ctx, e.js)
	}
	return e.report(stdout)
}

// validateArgs parses every URL argument's job, rejecting the bad ones
// (named on stderr, counted), and returns how many are valid. The valid
// ones are kept for publishInputs.
func (e *enqueuer) validateArgs(f *enqueueFlags) (int, error) {
	e.argJobs = map[int]jobs.Job{}
	argN := 0
	for _, in := range f.inputs {
		if in == "-" {
			continue
		}
		argN++
		data, err := f.argJob(in)
		if err != nil {
			return 0, fmt.Errorf("enqueue: %w", err)
		}
		label := "argument " + strconv.Itoa(argN)
		j, err := jobs.Parse(data)
		if err != nil {
			e.reject(label, err)
			continue
		}
		e.argJobs[argN] = j
	}
	return len(e.argJobs), nil
}

// publishInputs publishes the valid URL arguments and the JSON lines of
// stdin, in the order of the arguments.
func (e *enqueuer) publishInputs(ctx context.Context, f *enqueueFlags, stdin io.Reader) error {
	argN := 0
	for _, in := range f.inputs {
		if in != "-" {
			argN++
			if j, ok := e.argJobs[argN]; ok {
				if !j.IsDelete() { // a delete asks nothing of the origin
					e.warnUnreachable("argument "+strconv.Itoa(argN), j)
				}
				if err := e.publish(ctx, "argument "+strconv.Itoa(argN), j); err != nil {
					return err
				}
			}
			continue
		}
		if err := readLines(stdin, jobs.MaxJobLen, func(n int, line []byte, tooLong bool) error {
			label := "line " + strconv.Itoa(n)
			if tooLong {
				e.reject(label, fmt.Errorf("longer than %d bytes", jobs.MaxJobLen))
				return nil
			}
			if len(bytes.TrimSpace(line)) == 0 {
				return nil
			}
			return e.add(ctx, label, line)
		}); err != nil {
			return fmt.Errorf("enqueue: read standard input: %w", err)
		}
	}
	return nil
}

// duplicateWindow is MIRROR_JOBS's duplicate window, for the message that
// explains a duplicate; the default when the stream cannot be read.
func duplicateWindow(ctx context.Context, js jetstream.JetStream) time.Duration {
	if s, err := js.Stream(ctx, jobs.JobsStream); err == nil && s.CachedInfo().Config.Duplicates > 0 {
		return s.CachedInfo().Config.Duplicates
	}
	return jobs.DefaultJobsDuplicates
}

// connectJobs connects to NATS and makes sure the job streams exist, without
// changing the limits of streams that already do (the worker owns those)
// except for raising their replicas to replicas when given. On a NATS
// cluster, jobs left on one replica are reported on stderr: that must not
// happen silently. NATS's asynchronous errors (a permissions violation,
// say) go to stderr as warnings through zerolog, like every other library's
// reports.
func connectJobs(ctx context.Context, nf *natsFlags, replicas int, stderr io.Writer) (jetstream.JetStream, func(), error) {
	log, _ := newLogger(stderr, "console", "warn")
	nc, err := nf.dial(ctx, "mirrorworker-enqueue", jobs.JobsStream, stderr, broker.ClientLogOptions(log)...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(2*enqueueWindow),
		jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{KeepExisting: true, Replicas: replicas}); err != nil {
		nc.Close()
		return nil, nil, replicasHint(err, replicas)
	}
	if cluster := nc.ConnectedClusterName(); cluster != "" {
		if s, err := js.Stream(ctx, jobs.JobsStream); err == nil && s.CachedInfo().Config.Replicas < 2 {
			fmt.Fprintf(stderr, "warning: stream %s has 1 replica on NATS cluster %q: losing one server loses the queued jobs; "+
				"pass --stream-replicas 3 (here or to 'mirrorworker run') to replicate it\n", jobs.JobsStream, cluster)
		}
	}
	// Drain so that nothing published is left in the client's buffers.
	return js, func() { _ = nc.Drain() }, nil
}

// enqueuer validates jobs and publishes the valid ones asynchronously, at
// most enqueueWindow awaiting their ack. It is not safe for concurrent use.
type enqueuer struct {
	js     jetstream.JetStream // nil in a dry run
	dryRun bool
	stderr io.Writer

	pending []pendingPub
	// warned holds the hosts already warned about, one warning each.
	warned map[string]bool
	// privateOK: every worker announced on this NATS fetches loopback and
	// private addresses (podsAllowPrivate), so there is nothing to warn of.
	privateOK bool
	// window is the stream's duplicate window, known once duplicates were seen.
	window time.Duration
	// dupStdin: a duplicate came from a JSON line (the advice names "id").
	dupStdin bool

	// argJobs are the valid URL arguments, validated before connecting.
	argJobs map[int]jobs.Job // by argument number

	accepted, duplicates, rejected, failed int
}

type pendingPub struct {
	label string
	fut   jetstream.PubAckFuture
}

func (e *enqueuer) reject(label string, err error) {
	e.rejected++
	fmt.Fprintf(e.stderr, "%s: %v%s\n", label, err, rejectHint(label, err))
}

// rejectHint says what to do about a rejected job, where that is not plain
// from the error: the mistakes a newcomer makes first.
func rejectHint(label string, err error) string {
	var inv *jobs.InvalidError
	if !errors.As(err, &inv) {
		return ""
	}
	arg := strings.HasPrefix(label, "argument ")
	switch {
	case inv.Field == "target" && strings.Contains(inv.Msg, "query string") && arg:
		return " (pass --target KEY, the file's path in the mirror, e.g. --target go/VERSION; quote the URL in the shell)"
	case inv.Field == "target" && strings.Contains(inv.Msg, "query string"):
		return ` (add "target": "KEY", the file's path in the mirror)`
	case inv.Field == "url" && arg:
		return " (give absolute http:// or https:// URLs; flags start with --)"
	}
	return ""
}

// warnUnreachable warns, once per host, about a URL the worker refuses by
// default: loopback and private addresses need --allow-private-networks on
// the worker, unless the workers announce that they run with it
// (privateOK). Only literal addresses and localhost are judged here; a
// name that resolves to one is refused by the worker all the same.
func (e *enqueuer) warnUnreachable(label string, j jobs.Job) {
	host := j.Authority.Host
	if e.warned[host] {
		return
	}
	reason := ""
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		reason = fetch.ReasonLoopback
	} else if a, err := netip.ParseAddr(host); err == nil {
		reason = fetch.CheckAddr(a, false)
	}
	what := map[string]string{fetch.ReasonLoopback: "a loopback address", fetch.ReasonPrivate: "a private address"}[reason]
	if reason == "" || what != "" && e.privateOK {
		return
	}
	if e.warned == nil {
		e.warned = map[string]bool{}
	}
	e.warned[host] = true
	if what == "" {
		fmt.Fprintf(e.stderr, "warning: %s: %s is refused by every worker (%s); the job will be dead-lettered destination_refused\n", label, host, reason)
		return
	}
	fmt.Fprintf(e.stderr, "warning: %s: %s is %s: a worker refuses it (dead letter destination_refused) unless it runs with --allow-private-networks (make run RUN_ARGS=--allow-private-networks)\n", label, host, what)
}

// podsAllowPrivate reports whether the workers on js announce (in
// MIRROR_PODS) that they run with --allow-private-networks: at least one
// does and none does not. No worker announced, or the bucket unreadable,
// is false: the warning stays, as without this knowledge.
func podsAllowPrivate(ctx context.Context, js jetstream.JetStream) bool {
	pods, err := readPods(ctx, js)
	if err != nil || len(pods) == 0 {
		return false
	}
	for _, p := range pods {
		if !p.AllowPrivateNetworks {
			return false
		}
	}
	return true
}

// add validates one job and, unless this is a dry run, starts publishing it.
// Only a cancelled context is returned as an error; a bad job is counted.
func (e *enqueuer) add(ctx context.Context, label string, data []byte) error {
	j, err := jobs.Parse(data)
	if err != nil {
		e.reject(label, err)
		return nil
	}
	if !j.IsDelete() {
		e.warnUnreachable(label, j)
	}
	return e.publish(ctx, label, j)
}

// publish starts publishing a valid job (counts it, in a dry run).
func (e *enqueuer) publish(ctx context.Context, label string, j jobs.Job) error {
	if e.dryRun {
		e.accepted++
		return nil
	}
	m, _, err := jobs.NewMsg(j)
	if err != nil {
		e.reject(label, err)
		return nil
	}
	if len(e.pending) >= enqueueWindow {
		if err := e.flush(ctx); err != nil {
			return err
		}
	}
	fut, err := e.js.PublishMsgAsync(m)
	if err != nil {
		e.failed++
		fmt.Fprintf(e.stderr, "%s: publish: %v\n", label, err)
		return nil
	}
	e.pending = append(e.pending, pendingPub{label, fut})
	return nil
}

// flush waits for the ack of every pending publish.
func (e *enqueuer) flush(ctx context.Context) error {
	for _, p := range e.pending {
		select {
		case ack := <-p.fut.Ok():
			e.accepted++
			if ack.Duplicate {
				e.duplicates++
				e.dupStdin = e.dupStdin || strings.HasPrefix(p.label, "line ")
				fmt.Fprintf(e.stderr, "%s: duplicate of job %s, already in the stream: nothing new queued\n", p.label, p.fut.Msg().Header.Get(jetstream.MsgIDHeader))
			}
		case err := <-p.fut.Err():
			e.failed++
			fmt.Fprintf(e.stderr, "%s: publish: %v\n", p.label, err)
		case <-ctx.Done():
			return fmt.Errorf("enqueue: %w (%d publishes unconfirmed)", ctx.Err(), len(e.pending))
		}
	}
	e.pending = e.pending[:0]
	return nil
}

func (e *enqueuer) report(stdout io.Writer) error {
	switch {
	case e.dryRun:
		fmt.Fprintf(stdout, "valid %d (dry run: nothing published)\n", e.accepted)
	case e.duplicates > 0:
		fmt.Fprintf(stdout, "accepted %d (%d %s)\n", e.accepted, e.duplicates, plural(e.duplicates, "duplicate", "duplicates"))
		fresh := "pass a new --id"
		if e.dupStdin {
			fresh = `give the job a new "id"`
		}
		fmt.Fprintf(e.stderr, "note: a duplicate is a job id enqueued within the last %s (the stream's duplicate window): it is not queued again, and if it was stored already nothing is fetched. To fetch it again now, %s; or wait %s and enqueue it again.\n",
			e.window, fresh, e.window)
	default:
		fmt.Fprintf(stdout, "accepted %d\n", e.accepted)
	}
	switch {
	case e.rejected > 0 && e.failed > 0:
		return fmt.Errorf("enqueue: %d rejected, %d failed to publish", e.rejected, e.failed)
	case e.rejected > 0:
		return fmt.Errorf("enqueue: %d rejected", e.rejected)
	case e.failed > 0:
		return fmt.Errorf("enqueue: %d failed to publish", e.failed)
	}
	return nil
}

// readLines calls fn with each line of r (numbered from 1, without its line
// ending). A line longer than max is not kept in memory: fn gets tooLong.
func readLines(r io.Reader, max int, fn func(n int, line []byte, tooLong bool) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	for n := 1; ; n++ {
		buf = buf[:0]
		tooLong := false
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			if !tooLong {
				if len(buf)+len(chunk) > max+2 { // +2: the line ending
					tooLong, buf = true, buf[:0]
				} else {
					buf = append(buf, chunk...)
				}
			}
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if errors.Is(err, io.EOF) && len(buf) == 0 && !tooLong {
			return nil
		}
		line := bytes.TrimSuffix(bytes.TrimSuffix(buf, []byte("\n")), []byte("\r"))
		if ferr := fn(n, line, tooLong); ferr != nil {
			return ferr
		}
		if err != nil { // io.EOF after a last line without a newline
			return nil
		}
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
