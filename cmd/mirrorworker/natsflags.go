package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/dirlock"
)

// defaultEmbeddedListen is run's default --embedded-listen: the client
// address of its embedded NATS server.
const defaultEmbeddedListen = "127.0.0.1:4222"

// defaultNATS is where a running `mirrorworker run` listens by default.
const defaultNATS = "nats://" + defaultEmbeddedListen

// defaultDataDir is run's default --data-dir, where the commands look for a
// running worker when neither --nats-url nor --data-dir is given.
const defaultDataDir = "./data"

// defaultNATSTimeout is the default of --nats-connect-timeout.
const defaultNATSTimeout = 10 * time.Second

// natsFlags are the flags every subcommand that talks to NATS shares.
type natsFlags struct {
	url      string
	creds    string
	nkey     string
	user     string
	password string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	// timeout is --nats-connect-timeout, for the commands that register it.
	timeout time.Duration
	verbose bool
	// dataDir, when it points to a running worker's data directory, is
	// where its client URL is read (broker.ReadClientURL); dataDirSet says
	// it was given (flag or environment), so a missing worker is an error.
	dataDir    *string
	dataDirSet bool
	// onRetry hears each connect attempt that will be retried (run).
	onRetry func(attempt int, err error)

	// resolved by resolve: the URL used and where it came from.
	resolvedURL, source string
	announced           bool
}

func (n *natsFlags) register(fs *flag.FlagSet, urlHelp string) {
	fs.StringVar(&n.url, "nats-url", "", urlHelp)
	fs.StringVar(&n.creds, "nats-creds", "", "NATS credentials `file` (JWT and seed)")
	fs.StringVar(&n.nkey, "nats-nkey", "", "NATS NKey seed `file`")
	fs.StringVar(&n.user, "nats-user", "", "NATS user `name`")
	fs.StringVar(&n.password, "nats-password", "", "NATS `password` (prefer MIRRORWORKER_NATS_PASSWORD over the command line)")
	fs.StringVar(&n.tlsCA, "nats-tls-ca", "", "PEM `file` of root CAs for the NATS TLS connection")
	fs.StringVar(&n.tlsCert, "nats-tls-cert", "", "client certificate `file` for NATS TLS (with --nats-tls-key)")
	fs.StringVar(&n.tlsKey, "nats-tls-key", "", "client key `file` for NATS TLS")
}

// registerClient adds what the commands that reach a running worker's NATS
// share (enqueue, dlq, replay, pause, resume, status): the NATS flags, one
// timeout, -v, and, unless dataDir is given (replay has its own
// --data-dir), --data-dir to find the worker. oldTimeouts are earlier
// spellings of --nats-connect-timeout, still accepted with a warning.
func (n *natsFlags) registerClient(fs *flag.FlagSet, dataDir *string, oldTimeouts ...string) {
	n.register(fs, "NATS server `URL`(s) of the deployment (default: the worker of --data-dir, else "+defaultNATS+")")
	fs.DurationVar(&n.timeout, "nats-connect-timeout", defaultNATSTimeout, "give up reaching NATS after this long (connecting, and each request)")
	for _, old := range oldTimeouts {
		deprecate(fs, old, "nats-connect-timeout")
	}
	fs.BoolVar(&n.verbose, "v", false, "say which NATS server and stream are used, on standard error")
	if dataDir == nil {
		dataDir = new(string)
		fs.StringVar(dataDir, "data-dir", "", "data `directory` of a local 'mirrorworker run': reach the embedded NATS server of that worker (default "+defaultDataDir+" when a worker runs there)")
	}
	n.dataDir = dataDir
}

// markGiven records whether --data-dir was given, after parseFlags.
func (n *natsFlags) markGiven(fs *flag.FlagSet, getenv func(string) string) {
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "data-dir" {
			n.dataDirSet = true
		}
	})
	if getenv(envName("data-dir")) != "" {
		n.dataDirSet = true
	}
}

// resolve picks the server: --nats-url; else the worker running on
// --data-dir (an error when none runs there); else the worker running on
// ./data, if one does; else defaultNATS.
func (n *natsFlags) resolve() error {
	if n.resolvedURL != "" {
		return nil
	}
	switch {
	case n.url != "":
		n.resolvedURL, n.source = n.url, "--nats-url"
		return nil
	case n.dataDir != nil && *n.dataDir != "" && n.dataDirSet:
		u, err := broker.ReadClientURL(*n.dataDir)
		if err != nil {
			if errors.Is(err, broker.ErrNoClientURL) {
				if hint := localWorkerHint(*n.dataDir); hint != "" {
					return fmt.Errorf("%w: %s", err, hint)
				}
				return fmt.Errorf("%w: start 'mirrorworker run --data-dir %s' (with an --embedded-listen address), or pass --nats-url", err, *n.dataDir)
			}
			return err
		}
		n.resolvedURL, n.source = u, "the worker of --data-dir "+*n.dataDir
		return nil
	}
	if u, err := broker.ReadClientURL(defaultDataDir); err == nil {
		abs, _ := filepath.Abs(defaultDataDir)
		n.resolvedURL, n.source = u, "the worker of "+abs
		return nil
	}
	n.resolvedURL, n.source = defaultNATS, defaultSource
	return nil
}

// defaultSource is resolve's source of defaultNATS.
const defaultSource = "the default address"

// localWorkerHint says what a data directory tells of its worker when a
// command cannot reach it, or "" when it holds no worker's store: the
// embedded server that holds the queue runs only inside 'mirrorworker
// run', so with that worker down no command can reach the queue, and
// with a worker that listens in-process only, none ever can.
func localWorkerHint(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(abs, "nats")); err != nil {
		return ""
	}
	h, held, err := dirlock.Held(filepath.Join(abs, broker.StoreLockFile))
	switch {
	case err != nil:
		return ""
	case held && h.NATSURL == "" && h.PID != 0:
		return fmt.Sprintf("the worker of %s (pid %d) runs with no client address (--embedded-listen is empty), so no command can reach its queue: restart it with --embedded-listen %s, or run its NATS apart and pass --nats-url to both", abs, h.PID, strings.TrimPrefix(defaultNATS, "nats://"))
	case held:
		return "" // it runs and says where: the ordinary error applies
	}
	return fmt.Sprintf("the worker of %s is not running, and its embedded NATS server, which holds the queue (%s), runs only inside it: start it again with 'mirrorworker run --data-dir %s' (its queued jobs are kept), or pass --nats-url to reach a NATS server of your own", abs, filepath.Join(abs, "nats"), dataDir)
}

// local reports whether the server was not named with --nats-url: a local
// worker's embedded server, found or assumed.
func (n *natsFlags) local() bool { return n.url == "" }

// announce says on w which server (and where it came from) and which
// stream a command uses: always when the server was not named with
// --nats-url (a command must never reach a deployment by accident
// without saying so), and with -v.
func (n *natsFlags) announce(w io.Writer, stream string) {
	if n.announced || n.url != "" && !n.verbose {
		return
	}
	n.announced = true
	fmt.Fprintf(w, "using NATS %s (%s), stream %s\n", broker.RedactURL(n.resolvedURL), n.source, stream)
}

// connect dials the resolved server (resolve must have been called, or
// --nats-url given).
func (n *natsFlags) connect(ctx context.Context, name string, extra ...nats.Option) (*nats.Conn, error) {
	u := n.resolvedURL
	if u == "" {
		u = n.url
	}
	return broker.Connect(ctx, broker.ConnectOptions{
		URL: u, Name: name, CredsFile: n.creds, NKeyFile: n.nkey,
		User: n.user, Password: n.password,
		TLSCA: n.tlsCA, TLSCert: n.tlsCert, TLSKey: n.tlsKey,
		OnRetry: n.onRetry,
	}, extra...)
}

// dial is what every client command does to reach NATS: pick the server
// (resolve), say which one on stderr (announce), fail at once when a local
// one is not there (probeDefaultNATS), then connect within
// --nats-connect-timeout.
func (n *natsFlags) dial(ctx context.Context, name, stream string, stderr io.Writer, extra ...nats.Option) (*nats.Conn, error) {
	if err := n.resolve(); err != nil {
		return nil, err
	}
	n.announce(stderr, stream)
	if n.local() {
		if err := probeDefaultNATS(ctx, n.resolvedURL); err != nil {
			if n.source == defaultSource {
				if hint := localWorkerHint(defaultDataDir); hint != "" {
					return nil, fmt.Errorf("no NATS server at %s: %s", broker.RedactURL(n.resolvedURL), hint)
				}
			}
			return nil, err
		}
	}
	timeout := n.timeout
	if timeout <= 0 {
		timeout = defaultNATSTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := n.connect(cctx, name, extra...)
	if err != nil {
		if n.local() {
			return nil, fmt.Errorf("%w (NATS of %s: is 'mirrorworker run' running? otherwise pass --nats-url)", err, n.source)
		}
		return nil, err
	}
	return nc, nil
}

// natsRetryReporter logs each failed connect to an existing NATS deployment
// (the first at error level, naming the server and its error, then every
// tenth at warn, for a server that is down a long time) and keeps the last
// one for /readyz.
func natsRetryReporter(log zerolog.Logger, url string, last *atomic.Pointer[error]) func(int, error) {
	return func(attempt int, err error) {
		last.Store(&err)
		switch {
		case attempt == 1:
			log.Error().Err(err).Str("nats_url", broker.RedactURL(url)).Msg("cannot reach NATS; retrying every second")
		case attempt%10 == 0:
			log.Warn().Err(err).Str("nats_url", broker.RedactURL(url)).Int("attempts", attempt).Msg("still cannot reach NATS; retrying")
		}
	}
}

// startingError is what /readyz says before the worker is wired: what it
// waits for, and the last connect error if there was one.
func startingError(last *error) error {
	if last != nil {
		return fmt.Errorf("starting: connecting to NATS, retrying every second; last attempt: %w", *last)
	}
	return errors.New("starting: connecting to NATS and binding the consumer")
}
