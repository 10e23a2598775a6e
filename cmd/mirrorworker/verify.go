package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/bucket"
	"github.com/mirrorworker/mirrorworker/pipeline"
)

// auditTarget is a target verify can walk: every target --target opens.
type auditTarget interface {
	storeTarget
	List(ctx context.Context, fn func(key string) error) error
	Read(ctx context.Context, key string) (io.ReadCloser, error)
	Remove(ctx context.Context, key string) error
}

var (
	_ auditTarget = (*mirror.FileTarget)(nil)
	_ auditTarget = (*bucket.Target)(nil)
)

// verifyConfig is every flag of `mirrorworker verify`.
type verifyConfig struct {
	nats      natsFlags
	dataDir   string
	target    string
	repair    bool
	s3        s3Flags
	logFormat string
	logLevel  string
}

func (c *verifyConfig) register(fs *flag.FlagSet) {
	c.nats.registerClient(fs, &c.dataDir)
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "the worker's data `directory`: the default mirror is <data-dir>/mirror, and without --nats-url verify reads MIRROR_JOBS from the embedded NATS server of the worker running there")
	fs.StringVar(&c.target, "target", "", targetHelp+"; the target to verify (default file://<data-dir>/mirror)")
	fs.BoolVar(&c.repair, "repair", false, "re-enqueue the jobs (from MIRROR_JOBS, by key) of missing and corrupt objects; a corrupt object is removed first, so that its fetch is not answered 304")
	c.s3.register(fs)
	fs.StringVar(&c.logFormat, "log-format", "console", "log format: json or console")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level: trace, debug, info, warn or error")
}

// Findings of verify, one line each.
const (
	findingMissing  = "missing"  // a job in MIRROR_JOBS names the key; the target has no object
	findingCorrupt  = "corrupt"  // the bytes do not match the object's metadata, or it has none
	findingOrphaned = "orphaned" // an object no job in MIRROR_JOBS names
)

type finding struct {
	kind, key, detail string
	job               *jobs.Job // the newest job for the key, if any
}

// cmdVerify is `mirrorworker verify`: walk a mirror target (file or
// bucket), check each object's size and sha256 against its metadata, and
// hold the keys against the jobs of MIRROR_JOBS.
func cmdVerify(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	var c verifyConfig
	fs := newFlagSet("verify", stderr)
	c.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: mirrorworker verify [--target URL] [--repair] [flags]")
		fmt.Fprintln(fs.Output())
		fmt.Fprintln(fs.Output(), "Walks a mirror target and checks each object's size and sha256 against its recorded metadata, then")
		fmt.Fprintln(fs.Output(), "holds the keys against MIRROR_JOBS: it lists missing objects (a job names the key, the target has")
		fmt.Fprintln(fs.Output(), "nothing), corrupt ones (bytes or metadata wrong) and orphaned ones (no job names them). Run it when")
		fmt.Fprintln(fs.Output(), "the queue is drained: a job not yet done counts as missing. Exit status 1 when objects are missing or")
		fmt.Fprintln(fs.Output(), "corrupt and --repair was not given (orphans are listed, never removed).")
		fmt.Fprintln(fs.Output())
		fs.PrintDefaults()
	}
	if err := c.parse(fs, args, getenv); err != nil {
		return err
	}
	log, err := newLogger(stderr, c.logFormat, c.logLevel)
	if err != nil {
		return usageError{err.Error()}
	}
	spec := c.target
	if spec == "" {
		if spec, err = pipeline.DefaultTarget(c.dataDir); err != nil {
			return err
		}
	}
	st, err := c.s3.openTarget(ctx, spec, nil, log)
	if err != nil {
		return err
	}
	target := st.(auditTarget)

	nc, err := c.nats.dial(ctx, "mirrorworker-verify", jobs.JobsStream, stderr, natsLogHandlers(log)...)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	want, err := jobsByKey(ctx, js)
	if err != nil {
		return err
	}
	res, err := audit(ctx, target, want, log)
	if err != nil {
		return err
	}
	printFindings(stdout, target.Root(), res, len(want))
	broken := res.count(findingMissing) + res.count(findingCorrupt)
	if !c.repair {
		if broken > 0 {
			return verifyFailed(fmt.Sprintf("verify: %d objects missing or corrupt (run again with --repair to re-enqueue their jobs)", broken))
		}
		return nil
	}
	n, err := repair(ctx, js, target, res.findings, time.Now())
	fmt.Fprintf(stdout, "re-enqueued %d of %d jobs of missing and corrupt objects\n", n, broken)
	return err
}

// parse reads verify's flags and reports every value that cannot work.
func (c *verifyConfig) parse(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	c.nats.markGiven(fs, getenv)
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	if len(fs.Args()) > 0 {
		bad("unexpected arguments %q", fs.Args())
	}
	if c.dataDir == "" && c.target == "" {
		bad("--data-dir must not be empty")
	}
	if c.nats.timeout <= 0 {
		bad("--nats-connect-timeout %s: want more than 0", c.nats.timeout)
	}
	c.s3.check(bad)
	if len(errs) > 0 {
		return usageError{"verify: " + strings.Join(errs, "; ")}
	}
	return nil
}

// printFindings writes one line per finding and the summary line.
func printFindings(w io.Writer, root string, res auditResult, keys int) {
	for _, f := range res.findings {
		line := fmt.Sprintf("%-9s %s", f.kind, f.key)
		if f.detail != "" {
			line += ": " + f.detail
		}
		if f.job != nil && f.kind != findingOrphaned {
			line += fmt.Sprintf(" (job %s, %s)", f.job.ID, f.job.URL)
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "verified %s: %d objects, %d ok, %d corrupt, %d orphaned; %d keys in %s, %d missing\n",
		root, res.objects, res.ok, res.count(findingCorrupt), res.count(findingOrphaned), keys, jobs.JobsStream, res.count(findingMissing))
}

// verifyFailed is verify's finding of damage: exit status 1, with no usage.
type verifyFailed string

func (e verifyFailed) Error() string { return string(e) }

// jobsByKey reads MIRROR_JOBS from its first message and returns the
// newest submitted job of each target key (the workers' copies, parked or
// continued, are not submitted jobs).
func jobsByKey(ctx context.Context, js jetstream.JetStream) (map[string]jobs.Job, error) {
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("no stream %s: no job says what the target should hold (has `mirrorworker run` ever run there?)", jobs.JobsStream)
		}
		return nil, fmt.Errorf("stream %s: %w", jobs.JobsStream, err)
	}
	last := s.CachedInfo().State.LastSeq
	out := map[string]jobs.Job{}
	if s.CachedInfo().State.Msgs == 0 {
		return out, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", jobs.JobsStream, err)
	}
	for {
		batch, err := cons.Fetch(512, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", jobs.JobsStream, err)
		}
		got, done := 0, false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			if md.Sequence.Stream >= last || md.NumPending == 0 {
				done = true
			}
			if jobs.IsCopy(m.Headers()) {
				continue
			}
			if j, err := jobs.Parse(m.Data()); err == nil {
				out[j.Target] = j
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("read %s: %w", jobs.JobsStream, err)
		}
		if done || got == 0 {
			return out, ctx.Err()
		}
	}
}

type auditResult struct {
	objects, ok int
	findings    []finding
}

func (r auditResult) count(kind string) int {
	n := 0
	for _, f := range r.findings {
		if f.kind == kind {
			n++
		}
	}
	return n
}

// audit walks t, checks each object against its metadata and every key
// against want; findings come sorted by key.
func audit(ctx context.Context, t auditTarget, want map[string]jobs.Job, log zerolog.Logger) (auditResult, error) {
	var res auditResult
	seen := map[string]bool{}
	err := t.List(ctx, func(key string) error {
		res.objects++
		seen[key] = true
		var job *jobs.Job
		if j, ok := want[key]; ok {
			job = &j
		}
		detail, err := checkObject(ctx, t, key)
		if err != nil {
			return err
		}
		switch {
		case job == nil:
			// An orphan's own state matters less than that no job knows it.
			res.findings = append(res.findings, finding{kind: findingOrphaned, key: key, detail: cmp.Or(detail, "intact") + "; no job in " + jobs.JobsStream + " names it"})
		case detail != "":
			res.findings = append(res.findings, finding{kind: findingCorrupt, key: key, detail: detail, job: job})
		default:
			res.ok++
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("verify %s: %w", t.Root(), err)
	}
	for key, j := range want {
		if !seen[key] {
			res.findings = append(res.findings, finding{kind: findingMissing, key: key, job: &j})
		}
	}
	sort.Slice(res.findings, func(a, b int) bool { return res.findings[a].key < res.findings[b].key })
	return res, nil
}

// checkObject returns what is wrong with the object under key ("" if
// nothing), or an error of the target itself.
func checkObject(ctx context.Context, t auditTarget, key string) (string, error) {
	if err := mirror.ValidateKey(key); err != nil {
		return "its name is not a valid key", nil
	}
	m, err := t.Stat(ctx, key)
	switch {
	case errors.Is(err, mirror.ErrNotFound):
		return "no metadata, or metadata of another size (" + err.Error() + ")", nil
	case err != nil:
		return "", err
	}
	r, err := t.Read(ctx, key)
	if err != nil {
		if errors.Is(err, mirror.ErrNotFound) {
			return "removed while verified", nil
		}
		return "", err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return "", fmt.Errorf("read %q: %w", key, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	switch {
	case n != m.Size:
		return fmt.Sprintf("%d bytes, metadata says %d", n, m.Size), nil
	case m.SHA256 == "":
		return "", nil // stored without a sha256 to hold it to (see ADR 0019); size checked
	case sum != m.SHA256:
		return fmt.Sprintf("sha256 %s, metadata says %s", sum, m.SHA256), nil
	}
	return "", nil
}

// repair re-enqueues the newest job of every missing and corrupt key, the
// corrupt object removed first. It returns how many it published.
func repair(ctx context.Context, js jetstream.JetStream, t auditTarget, fs []finding, now time.Time) (int, error) {
	n := 0
	suffix := ".verify-" + strconv.FormatInt(now.Unix(), 36)
	for _, f := range fs {
		if f.kind == findingOrphaned {
			continue
		}
		if f.job == nil {
			continue // corrupt, but no job says where it came from
		}
		if f.kind == findingCorrupt {
			if err := t.Remove(ctx, f.key); err != nil {
				return n, fmt.Errorf("repair %s: %w", f.key, err)
			}
		}
		j := *f.job
		base := j.ID
		if len(base)+len(suffix) > jobs.MaxIDLen {
			base = base[:jobs.MaxIDLen-len(suffix)]
		}
		j.ID = base + suffix
		m, _, err := jobs.NewMsg(j)
		if err != nil {
			return n, fmt.Errorf("repair %s: %w", f.key, err)
		}
		m.Header.Set(HeaderRepairOf, f.kind)
		m.Header.Set(HeaderRepairJob, f.job.ID)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return n, fmt.Errorf("repair %s: publish job %s: %w", f.key, j.ID, err)
		}
		n++
	}
	return n, nil
}

// Provenance headers of a job verify --repair re-enqueued.
const (
	HeaderRepairOf  = "Mirrorworker-Repair-Of"  // missing or corrupt
	HeaderRepairJob = "Mirrorworker-Repair-Job" // the id of the job re-enqueued
)
