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

// defaultEnqueueURL is the embedded server of a running `mirrorworker run`.
const defaultEnqueueURL = "nats://127.0.0.1:4222"

// enqueueWindow bounds the asynchronous publishes awaiting their ack.
const enqueueWindow = 256

// jobFlags describe the job of a URL argument. They are read from the
// command line only: MIRRORWORKER_TARGET, for one, configures the worker's
// mirror target and must not become every enqueued job's target key.
var jobFlags = []string{"tenant", "kind", "target", "id"}

// cmdEnqueue publishes jobs: `mirrorworker enqueue [flags] [URL...]`, or JSON
// lines on stdin when no URL is given (or "-" is). Every job is validated;
// valid ones are published, and each rejected one is named on stderr
// ("line 3: url: ..."), which makes the command fail.
func cmdEnqueue(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("enqueue", stderr)
	nf := natsFlags{defaultTo: defaultEnqueueURL}
	nf.register(fs, "NATS server URL (default "+defaultEnqueueURL+", the embedded server of a running 'mirrorworker run')")
	tenant := fs.String("tenant", "", "tenant of the URL arguments (default \"default\"); command line only")
	kind := fs.String("kind", "", "kind of the URL arguments: artifact (default), metadata or companion; command line only")
	target := fs.String("target", "", "mirror target `key` of the single URL argument (default <host>/<path>, with ':' as '_': 127.0.0.1_8000/a.txt); required for a URL with a query string; command line only")
	id := fs.String("id", "", "job `id` of the single URL argument (default: derived from the URL and target, so the same job enqueued twice within the stream's duplicate window is one job); command line only")
	dryRun := fs.Bool("dry-run", false, "validate only; connect to nothing and publish nothing")
	connectTimeout := fs.Duration("nats-connect-timeout", 10*time.Second, "give up connecting to NATS after this long")
	// --connect-timeout meant NATS here and the origin in run and replay;
	// the old spelling keeps working for scripts that use it.
	deprecate(fs, "connect-timeout", "nats-connect-timeout")
	var replicas int
	registerReplicasFlag(fs, &replicas)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mirrorworker enqueue [flags] [URL...]")
		fmt.Fprintln(stderr, "       mirrorworker enqueue [flags] < jobs.jsonl   (one JSON job per line, or '-' as an argument)")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Flags may come before or after the URLs:")
		fmt.Fprintln(stderr, "  mirrorworker enqueue 'https://go.dev/VERSION?m=text' --target go/VERSION")
		fmt.Fprintln(stderr)
		printFlags(fs)
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	var bad []string
	checkReplicas(func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }, replicas)
	if len(bad) > 0 {
		return usageError{"enqueue: " + bad[0]}
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	for _, name := range jobFlags {
		if !onCommandLine[name] {
			_ = fs.Lookup(name).Value.Set("") // undo a value taken from the environment
		}
	}

	inputs := fs.Args()
	if len(inputs) == 0 {
		inputs = []string{"-"}
	}
	urls, stdinCount := 0, 0
	for _, in := range inputs {
		if in == "-" {
			stdinCount++
		} else {
			urls++
		}
	}
	switch {
	case stdinCount > 1:
		return usageError{"enqueue: '-' (standard input) may be given once"}
	case stdinCount > 0 && (*tenant != "" || *kind != "" || *target != "" || *id != ""):
		return usageError{"enqueue: --tenant, --kind, --target and --id apply to URL arguments, not to JSON lines (put the fields in the JSON)"}
	case *target != "" && urls != 1:
		return usageError{fmt.Sprintf("enqueue: --target needs exactly one URL argument, got %d (enqueue the URLs one by one, or as JSON lines with a \"target\" each)", urls)}
	case *id != "" && urls != 1:
		return usageError{fmt.Sprintf("enqueue: --id needs exactly one URL argument, got %d", urls)}
	}

	e := &enqueuer{stderr: stderr, dryRun: *dryRun}
	if !*dryRun {
		cctx, cancel := context.WithTimeout(ctx, *connectTimeout)
		js, closeConn, err := connectJobs(cctx, &nf, replicas, stderr)
		cancel()
		if err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		defer closeConn()
		e.js = js
	}

	argN := 0
	for _, in := range inputs {
		if in == "-" {
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
			continue
		}
		argN++
		fields := map[string]string{"url": in}
		for k, v := range map[string]string{"tenant": *tenant, "kind": *kind, "target": *target, "id": *id} {
			if v != "" {
				fields[k] = v
			}
		}
		data, err := json.Marshal(fields)
		if err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		if err := e.add(ctx, "argument "+strconv.Itoa(argN), data); err != nil {
			return err
		}
	}
	if err := e.flush(ctx); err != nil {
		return err
	}
	if e.duplicates > 0 {
		e.window = duplicateWindow(ctx, e.js)
	}
	return e.report(stdout)
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
	if nf.url == "" {
		if err := probeDefaultNATS(ctx, nf.defaultTo); err != nil {
			return nil, nil, err
		}
	}
	log, _ := newLogger(stderr, "console", "warn")
	nc, err := nf.connect(ctx, "mirrorworker-enqueue", broker.ClientLogOptions(log)...)
	if err != nil {
		if nf.url == "" {
			err = fmt.Errorf("%w (is 'mirrorworker run' running? otherwise pass --nats-url)", err)
		}
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
	// window is the stream's duplicate window, known once duplicates were seen.
	window time.Duration
	// dupStdin: a duplicate came from a JSON line (the advice names "id").
	dupStdin bool

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
// the worker. Only literal addresses and localhost are judged here; a name
// that resolves to one is refused by the worker all the same.
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
	if reason == "" {
		return
	}
	if e.warned == nil {
		e.warned = map[string]bool{}
	}
	e.warned[host] = true
	what := map[string]string{fetch.ReasonLoopback: "a loopback address", fetch.ReasonPrivate: "a private address"}[reason]
	if what == "" {
		fmt.Fprintf(e.stderr, "warning: %s: %s is refused by every worker (%s); the job will be dead-lettered destination_refused\n", label, host, reason)
		return
	}
	fmt.Fprintf(e.stderr, "warning: %s: %s is %s: a worker refuses it (dead letter destination_refused) unless it runs with --allow-private-networks (make run RUN_ARGS=--allow-private-networks)\n", label, host, what)
}

// add validates one job and, unless this is a dry run, starts publishing it.
// Only a cancelled context is returned as an error; a bad job is counted.
func (e *enqueuer) add(ctx context.Context, label string, data []byte) error {
	j, err := jobs.Parse(data)
	if err != nil {
		e.reject(label, err)
		return nil
	}
	e.warnUnreachable(label, j)
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
