package main

import (
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/credentials"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/pipeline"
	"github.com/mirrorworker/mirrorworker/worker"
)

// workerFlags are the flags of the commands that run a worker of their own
// (run and replay): fetch slots, pacer, fetch client, consumer, worker id
// and logging. They are checked and turned into the pacer, fetch client and
// worker the same way in both, so that a replay is exactly as polite as the
// live worker.
type workerFlags struct {
	concurrency   int
	floor         time.Duration
	maxInFlight   int
	policy        string
	allowPrivate  bool
	maxBodySize   byteSize
	maxIdleConns  int
	connectTO     time.Duration
	headerTO      time.Duration
	idleTO        time.Duration
	minRate       byteSize
	minRateWindow time.Duration
	deadlineBase  time.Duration
	deadlineRate  byteSize
	maxBandwidth  rateFlag
	failureBudget int
	ackWait       time.Duration
	ackBatch      time.Duration
	maxAckPending int
	workerID      string
	logFormat     string
	logLevel      string
	credentials   string
	credsReload   time.Duration
	proxy         string
	proxyCreds    string
	authHold      time.Duration
	authHolds     int
	maxDeletes    int

	// getenv is the command's environment (HTTP_PROXY, HTTPS_PROXY,
	// NO_PROXY); proxyConf is the proxy check made of it and the flags.
	getenv    func(string) string
	proxyConf fetch.Proxy

	workerIDPrefix string // of the default worker id, <prefix><hostname>-<pid>

	// targetOpts are the flags of the --target (target.go).
	targetOpts targetFlags

	// timeScale is pacer.Options.Scale: run's --time-scale, for load tests
	// only; 0 (replay, which has no such flag) is real time.
	timeScale float64

	// explicit holds the flags given on the command line or in the
	// environment: --floor and --max-in-flight override a policy file's
	// default only when given.
	explicit map[string]bool
}

// workerDefaults is what differs between the commands' worker flags: the
// help texts that say whose consumer or policy it is, and the defaults.
type workerDefaults struct {
	policyHelp        string
	ackWaitHelp       string
	maxAckPendingHelp string
	workerIDHelp      string
	workerIDPrefix    string
	logFormat         string
	logLevel          string
}

func (w *workerFlags) register(fs *flag.FlagSet, d workerDefaults) {
	fs.IntVar(&w.concurrency, "concurrency", worker.DefaultConcurrency(), "fetch slots: requests in flight across all authorities; the default is 16 per CPU (GOMAXPROCS), within 16..128 (README: Sizing)")
	fs.DurationVar(&w.floor, "floor", pacer.DefaultFloor, "minimum spacing between requests to one authority as it receives them, for authorities the policy file does not name; 0 allowed (given explicitly, it overrides the policy file's default)")
	fs.IntVar(&w.maxInFlight, "max-in-flight", pacer.DefaultMaxInFlight, "cap of requests in flight to one authority, for authorities the policy file does not name (given explicitly, it overrides the policy file's default)")
	fs.StringVar(&w.policy, "policy", "", d.policyHelp)
	fs.BoolVar(&w.allowPrivate, "allow-private-networks", false, "allow fetching from loopback and private addresses (link-local and cloud metadata stay refused)")
	w.maxBodySize = fetch.DefaultMaxBodySize
	fs.Var(&w.maxBodySize, "max-body-size", "largest body stored, a `size` in bytes or with a unit (16GiB, 500MB)")
	fs.IntVar(&w.maxIdleConns, "max-idle-conns", fetch.DefaultMaxIdleConns, "idle keep-alive connections kept across all origins (about 22 KiB and one file descriptor each; never more than the file limit less 1024): above the authorities a worker cycles through, or each job pays a new connection (README: Sizing)")
	fs.DurationVar(&w.connectTO, "origin-connect-timeout", fetch.DefaultConnectTimeout, "timeout to connect to an origin (TLS handshake included)")
	// Until this flag had "origin" in its name, --connect-timeout meant the
	// origin here and NATS in enqueue; old configurations keep working.
	deprecate(fs, "connect-timeout", "origin-connect-timeout")
	fs.DurationVar(&w.headerTO, "header-timeout", fetch.DefaultResponseHeaderTimeout, "timeout from a request sent to its response headers")
	fs.DurationVar(&w.idleTO, "idle-timeout", fetch.DefaultIdleTimeout, "longest wait for a body read to make progress")
	w.minRate = fetch.DefaultMinRate
	fs.Var(&w.minRate, "min-transfer-rate", "slowest body transfer kept, in `bytes` per second (with a unit: 1KiB); judged over --min-transfer-window, a slower fetch frees its slot and is retried (too_slow); 0: no minimum")
	fs.DurationVar(&w.minRateWindow, "min-transfer-window", fetch.DefaultMinRateWindow, "time over which --min-transfer-rate is judged")
	fs.DurationVar(&w.deadlineBase, "body-deadline-base", fetch.DefaultDeadlineBase, "total deadline of a body: this plus its expected size at --body-deadline-rate")
	w.deadlineRate = fetch.DefaultDeadlineRate
	fs.Var(&w.deadlineRate, "body-deadline-rate", "`bytes` per second the total deadline of a body allows for its expected size (Content-Length, else the job's size, else --max-body-size); 0: no total deadline")
	fs.Var(&w.maxBandwidth, "max-bandwidth", "cap of this process's body transfers from every origin together, a `rate` in bytes per second (1MiB/s, 500KB/s, or a plain number); each authority's own cap is its policy's bandwidth (README: Changing politeness on a running cluster); 0: none")
	fs.IntVar(&w.failureBudget, "failure-budget", worker.DefaultFailureBudget, "attempts of a job with transient errors before it is dead-lettered")
	fs.DurationVar(&w.ackWait, "ack-wait", jobs.DefaultAckWait, d.ackWaitHelp)
	fs.DurationVar(&w.ackBatch, "ack-batch", worker.DefaultAckBatch, "how long a done job's ack may wait to be sent with the others done meanwhile, where acks are plain (a jobs stream of one replica on the connected server): nats-server then rewrites each consumer's state less often; a crash of the worker loses at most this long's acks, and those jobs come back after --ack-wait; 0: each at once")
	fs.IntVar(&w.maxAckPending, "max-ack-pending", jobs.DefaultMaxAckPending, d.maxAckPendingHelp)
	fs.StringVar(&w.workerID, "worker-id", "", d.workerIDHelp)
	w.workerIDPrefix = d.workerIDPrefix
	fs.StringVar(&w.logFormat, "log-format", d.logFormat, "log format: json or console")
	fs.StringVar(&w.logLevel, "log-level", d.logLevel, "log level: trace, debug, info, warn or error")
	fs.StringVar(&w.credentials, "credentials", "", "per-authority credentials: a JSON `file`, or a directory of them (a mounted Secret), re-read every --credentials-reload; a change that does not parse keeps the last good set (README: Private upstreams)")
	fs.DurationVar(&w.credsReload, "credentials-reload", credentials.DefaultReloadInterval, "how often the --credentials files are re-read")
	fs.DurationVar(&w.authHold, "auth-hold", worker.DefaultAuthHold, "first hold of an authority that answers 401/403 in a row (doubling with each hold; a change of its credential ends it)")
	fs.IntVar(&w.maxDeletes, "max-deletes-per-minute", worker.DefaultMaxDeletesPerMinute, "delete jobs this process carries out in any minute; past it, deletes wait in the stream (fetches go on), and the log, status and mirrorworker_delete_limit_reached say so; 0: no limit")
	fs.IntVar(&w.authHolds, "auth-holds", worker.DefaultAuthHolds, "holds without a success before a 401/403 dead-letters its job auth_failed")
	fs.StringVar(&w.proxy, "proxy", "", "egress proxy `URL` (http://host:port) for every origin, over HTTP_PROXY and HTTPS_PROXY (NO_PROXY still applies); without user information: see --proxy-credentials")
	fs.StringVar(&w.proxyCreds, "proxy-credentials", "", "`file` holding user:password for the egress proxy (Proxy-Authorization: Basic)")
	w.targetOpts.register(fs)
	w.targetOpts.registerSync(fs)
}

// proxyConfig is the egress proxy of the environment, with --proxy over
// HTTP_PROXY and HTTPS_PROXY and --proxy-credentials as its user. Errors
// never repeat a password.
func (w *workerFlags) proxyConfig() (fetch.Proxy, error) {
	getenv := w.getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	p := fetch.ProxyFromEnv(getenv)
	if w.proxy != "" {
		u, err := url.Parse(w.proxy)
		switch {
		case err != nil || u.Host == "":
			return p, fmt.Errorf("--proxy: want a URL such as http://proxy.internal:3128")
		case u.User != nil:
			return p, fmt.Errorf("--proxy: no user information in the URL (it would be logged); put user:password in a file and pass --proxy-credentials")
		case u.Scheme != "http" && u.Scheme != "https":
			return p, fmt.Errorf("--proxy %s://%s: want an http or https proxy", u.Scheme, u.Host)
		}
		p.HTTPProxy, p.HTTPSProxy = w.proxy, w.proxy
	}
	if w.proxyCreds != "" {
		b, err := os.ReadFile(w.proxyCreds)
		if err != nil {
			return p, fmt.Errorf("--proxy-credentials: %w", err)
		}
		user, pass, ok := strings.Cut(strings.TrimRight(string(b), "\r\n"), ":")
		if !ok || user == "" {
			return p, fmt.Errorf("--proxy-credentials %s: want one line user:password", w.proxyCreds)
		}
		if p.IsZero() {
			return p, fmt.Errorf("--proxy-credentials: no proxy (give --proxy, or set HTTPS_PROXY or HTTP_PROXY)")
		}
		p.User = url.UserPassword(user, pass)
	}
	return p, nil
}

// explicitFlags names the flags given on the command line or in the
// environment (parseFlags fills the latter without marking them as set).
func explicitFlags(fs *flag.FlagSet, getenv func(string) string) map[string]bool {
	set := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if getenv(envName(f.Name)) != "" {
			set[f.Name] = true
		}
	})
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// durationFlag is a duration flag of the command's own that must be more
// than 0, checked along with the worker's timeouts.
type durationFlag struct {
	name string
	v    time.Duration
}

// check reports through bad every worker flag value that cannot work; more
// are the command's own durations that must be more than 0.
func (w *workerFlags) check(bad func(format string, a ...any), more ...durationFlag) {
	if w.concurrency < 1 {
		bad("--concurrency %d: want at least 1", w.concurrency)
	}
	if w.floor < 0 {
		bad("--floor %s: want 0 or more", w.floor)
	}
	if w.maxInFlight < 1 {
		bad("--max-in-flight %d: want at least 1", w.maxInFlight)
	}
	if w.maxIdleConns < 1 {
		bad("--max-idle-conns %d: want at least 1", w.maxIdleConns)
	}
	if w.maxBodySize <= 0 {
		bad("--max-body-size %d: want more than 0", w.maxBodySize)
	}
	if err := pacer.CheckBandwidth(int64(w.maxBandwidth)); err != nil {
		bad("--max-bandwidth: %s", err)
	}
	if w.authHolds < 1 {
		bad("--auth-holds %d: want at least 1", w.authHolds)
	}
	if w.ackBatch < 0 || w.ackWait > 0 && w.ackBatch >= w.ackWait/2 {
		bad("--ack-batch %s: want 0 or more, and less than half of --ack-wait (%s)", w.ackBatch, w.ackWait)
	}
	durations := append([]durationFlag{{"origin-connect-timeout", w.connectTO}, {"header-timeout", w.headerTO}, {"idle-timeout", w.idleTO},
		{"credentials-reload", w.credsReload}, {"auth-hold", w.authHold},
		{"min-transfer-window", w.minRateWindow}, {"body-deadline-base", w.deadlineBase}, {"ack-wait", w.ackWait}}, more...)
	for _, d := range durations {
		if d.v <= 0 {
			bad("--%s %s: want more than 0", d.name, d.v)
		}
	}
	if w.maxDeletes < 0 || w.maxDeletes > worker.MaxDeletesPerMinuteLimit {
		bad("--max-deletes-per-minute %d: want 0 (no limit) to %d", w.maxDeletes, worker.MaxDeletesPerMinuteLimit)
	}
	if w.failureBudget < 1 {
		bad("--failure-budget %d: want at least 1", w.failureBudget)
	}
	if w.maxAckPending < 1 {
		bad("--max-ack-pending %d: want at least 1", w.maxAckPending)
	}
	if w.logFormat != "json" && w.logFormat != "console" {
		bad("--log-format %q: want json or console", w.logFormat)
	}
	if _, err := zerolog.ParseLevel(w.logLevel); err != nil || w.logLevel == "" {
		bad("--log-level %q: want trace, debug, info, warn or error", w.logLevel)
	}
	if p, err := w.proxyConfig(); err != nil {
		bad("%s", err)
	} else {
		w.proxyConf = p
	}
	if w.credentials != "" {
		if _, err := os.Stat(w.credentials); err != nil {
			bad("--credentials: %s", err)
		}
	}
	w.targetOpts.check(bad)
}

// logger defaults the worker id to <prefix><hostname>-<pid> and builds the
// command's logger, tagged with it.
func (w *workerFlags) logger(stderr io.Writer) (zerolog.Logger, error) {
	log, err := newLogger(stderr, w.logFormat, w.logLevel)
	if err != nil {
		return log, usageError{err.Error()}
	}
	if w.workerID == "" {
		w.workerID = w.workerIDPrefix + worker.DefaultWorkerID()
	}
	return log.With().Str("worker_id", w.workerID).Logger(), nil
}

// pacerPolicy is the policy file (if any) with the default floor and cap
// from the flags: a flag's default yields to the file's "default" entry, a
// flag given explicitly wins over it.
func (w *workerFlags) pacerPolicy() (*pacer.Policy, error) {
	p := pacer.DefaultPolicy()
	if w.policy != "" {
		var err error
		if p, err = pacer.LoadPolicy(w.policy); err != nil {
			return nil, fmt.Errorf("--policy: %w", err)
		}
	}
	if w.policy == "" || w.explicit["floor"] {
		p = p.WithDefaultFloor(w.floor)
	}
	if w.policy == "" || w.explicit["max-in-flight"] {
		q := *p
		q.Default.MaxInFlight = w.maxInFlight
		p = &q
	}
	return p, nil
}

func (w *workerFlags) fetchOptions() *fetch.Options {
	orNone := func(b byteSize) int64 { // a flag's 0 is fetch's "none"
		if b == 0 {
			return -1
		}
		return int64(b)
	}
	return &fetch.Options{
		ConnectTimeout:        w.connectTO,
		TLSHandshakeTimeout:   w.connectTO,
		ResponseHeaderTimeout: w.headerTO,
		IdleTimeout:           w.idleTO,
		MinRate:               orNone(w.minRate),
		MinRateWindow:         w.minRateWindow,
		DeadlineBase:          w.deadlineBase,
		DeadlineRate:          orNone(w.deadlineRate),
		MaxBodySize:           int64(w.maxBodySize),
		MaxIdleConns:          w.maxIdleConns,
		AllowPrivate:          w.allowPrivate,
		UserAgent:             fetch.UserAgent(version),
		Proxy:                 w.proxyConf,
	}
}

// pipelineConfig is the pipeline (package pipeline) the worker flags
// describe, with the pacer policy and the registry of the command, so that
// a replay is exactly as polite as the live worker.
func (w *workerFlags) pipelineConfig(reg prometheus.Registerer, policy *pacer.Policy, log zerolog.Logger) pipeline.Config {
	return pipeline.Config{
		Concurrency:       w.concurrency,
		FailureBudget:     w.failureBudget,
		AckWait:           w.ackWait,
		AckBatch:          w.ackBatch,
		WorkerID:          w.workerID,
		Policy:            policy,
		TimeScale:         w.timeScale,
		Fetch:             w.fetchOptions(),
		MaxBandwidth:      int64(w.maxBandwidth),
		Credentials:       w.credentials,
		CredentialsReload: w.credsReload,
		Auth:              worker.AuthRule{Hold: w.authHold, Holds: w.authHolds},
		MaxDeletes:        noLimitAsNegative(w.maxDeletes),
		Registerer:        reg,
		Logger:            log,
	}
}

// noLimitAsNegative turns a flag's "0: no limit" into an option's "negative: no limit"
// (an option's 0 is its default).
func noLimitAsNegative(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
