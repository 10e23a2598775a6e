// Package broker provides the NATS side of mirrorworker's plumbing: an
// embedded JetStream server for the zero-setup default and for tests, and a
// connection to an existing NATS deployment with the usual credentials.
//
// It knows nothing about jobs or streams; package jobs defines those.
package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"
)

// EmbeddedOptions configures an embedded server. StoreDir is required; with
// Listen empty the server accepts in-process connections only.
type EmbeddedOptions struct {
	// StoreDir is where JetStream keeps its files. Required.
	StoreDir string
	// Listen is "host:port" for client connections; "" means in-process only,
	// port "0" picks a free port.
	Listen string
	// MaxStore bounds JetStream file storage in bytes; 0 means unlimited.
	MaxStore int64
	// ReadyTimeout bounds start-up; default 30 s.
	ReadyTimeout time.Duration
	// Logger receives the server's warnings and errors (notices at debug
	// level); the zero Logger discards them. The server never writes to
	// stderr itself.
	Logger zerolog.Logger
}

// Embedded is a running in-process NATS server with JetStream enabled. It is
// safe for concurrent use.
type Embedded struct {
	srv *server.Server
}

// StartEmbedded starts a NATS server with JetStream in this process and waits
// until it accepts connections.
func StartEmbedded(opts EmbeddedOptions) (*Embedded, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("embedded nats: store dir is required")
	}
	if err := os.MkdirAll(opts.StoreDir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	so := &server.Options{
		ServerName:         "mirrorworker-embedded",
		JetStream:          true,
		StoreDir:           filepath.Clean(opts.StoreDir),
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  opts.MaxStore,
		NoSigs:             true,
		NoLog:              true,
		DontListen:         opts.Listen == "",
		MaxPayload:         8 << 20,
	}
	if opts.Listen != "" {
		host, port, err := net.SplitHostPort(opts.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: listen address %q: %w", opts.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || p > 65535 {
			return nil, fmt.Errorf("embedded nats: listen port %q", port)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		so.Host, so.Port = host, p
	}
	srv, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	srv.SetLoggerV2(serverLogger{opts.Logger}, false, false, false)
	go srv.Start()
	timeout := opts.ReadyTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	if !srv.ReadyForConnections(timeout) {
		srv.Shutdown()
		if opts.Listen != "" {
			return nil, fmt.Errorf("embedded nats: not ready after %s (is %s already in use? pass --embedded-listen or --nats-url)", timeout, opts.Listen)
		}
		return nil, fmt.Errorf("embedded nats: not ready after %s", timeout)
	}
	return &Embedded{srv: srv}, nil
}

// ClientURL is the nats:// URL clients outside the process can use, or "" when
// the server does not listen.
func (e *Embedded) ClientURL() string {
	if e.srv.Addr() == nil {
		return ""
	}
	return e.srv.ClientURL()
}

// Connect returns an in-process client connection (no TCP).
func (e *Embedded) Connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{nats.InProcessServer(e.srv), nats.Name(name), nats.MaxReconnects(-1)}, extra...)
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect embedded nats: %w", err)
	}
	return nc, nil
}

// Shutdown stops the server and waits until it is down.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// ConnectOptions describes how to reach an existing NATS deployment. Every
// field is optional except URL.
type ConnectOptions struct {
	URL       string // comma-separated server URLs
	Name      string // client name shown by the server
	CredsFile string // JWT + seed credentials file
	NKeyFile  string // NKey seed file
	User      string
	Password  string
	TLSCA     string // PEM file with root CAs
	TLSCert   string // client certificate (with TLSKey)
	TLSKey    string
	// OnRetry, if set, hears each failed attempt that Connect will retry
	// (no server answered), numbered from 1, for a log line and /readyz.
	OnRetry func(attempt int, err error)
}

// Connect dials an existing NATS deployment. It retries the initial connect
// while no server answers, until ctx is done, so that a worker can start
// before its NATS cluster; o.OnRetry hears each failed attempt. Everything
// a retry cannot fix fails at once, naming what to fix: a credentials, NKey
// or TLS file that is missing, unreadable or not what it should be (checked
// before dialling), and a server that refuses the authorization (its words
// are in the error, which wraps nats.ErrAuthorization and its kin).
func Connect(ctx context.Context, o ConnectOptions, extra ...nats.Option) (*nats.Conn, error) {
	if o.URL == "" {
		return nil, errors.New("connect nats: empty URL")
	}
	if err := CheckFiles(o); err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", RedactURL(o.URL), err)
	}
	opts := []nats.Option{nats.Name(o.Name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(false)}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.NKeyFile != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("connect nats: nkey seed file %s: %w", o.NKeyFile, err)
		}
		opts = append(opts, opt)
	}
	if o.User != "" || o.Password != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" || o.TLSKey != "" {
		if o.TLSCert == "" || o.TLSKey == "" {
			return nil, errors.New("connect nats: TLS client certificate and key go together")
		}
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	opts = append(opts, extra...)
	var lastErr error
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(o.URL, opts...)
		if err == nil {
			return nc, nil
		}
		lastErr = err
		if !Retryable(err) {
			return nil, fmt.Errorf("connect nats %s: %w%s", RedactURL(o.URL), err, authHint(o, err))
		}
		if o.OnRetry != nil {
			o.OnRetry(attempt, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect nats %s: %w (last error: %v)", RedactURL(o.URL), ctx.Err(), lastErr)
		case <-time.After(time.Second):
		}
	}
}

// Retryable reports whether a failed connect may succeed when tried again:
// no server answered (yet). An authorization the server refused, a bad
// file or option, a TLS mismatch are not.
func Retryable(err error) bool {
	switch {
	case isAuthError(err):
		return false
	case errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrTimeout), errors.Is(err, io.EOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// authHint names the credentials a refused authorization was tried with.
func authHint(o ConnectOptions, err error) string {
	if !isAuthError(err) {
		return ""
	}
	var used []string
	if o.CredsFile != "" {
		used = append(used, "credentials file "+o.CredsFile)
	}
	if o.NKeyFile != "" {
		used = append(used, "NKey seed file "+o.NKeyFile)
	}
	if o.User != "" {
		used = append(used, "user "+strconv.Quote(o.User))
	}
	if len(used) == 0 {
		return " (the server wants credentials: pass --nats-creds, --nats-nkey or --nats-user)"
	}
	return " (the server refused " + strings.Join(used, ", ") + ")"
}

// CheckFiles reads every file o names, so that a missing or unreadable one
// (a Secret not mounted, a dynamic user without read access) or one that is
// not what it should be (a placeholder) is one clear error with its path
// before anything is dialled.
func CheckFiles(o ConnectOptions) error {
	if o.CredsFile != "" {
		b, err := os.ReadFile(o.CredsFile)
		if err != nil {
			return fmt.Errorf("credentials file: %w", err)
		}
		if !bytes.Contains(b, []byte("BEGIN NATS USER JWT")) {
			return fmt.Errorf("credentials file %s: no NATS user JWT in it (a placeholder? want the .creds file of your NATS account, JWT and seed)", o.CredsFile)
		}
		if _, err := nkeys.ParseDecoratedNKey(b); err != nil {
			return fmt.Errorf("credentials file %s: no user seed in it: %w", o.CredsFile, err)
		}
	}
	for _, f := range []struct{ what, path string }{
		{"NKey seed file", o.NKeyFile}, {"TLS CA file", o.TLSCA}, {"TLS certificate", o.TLSCert}, {"TLS key", o.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.ReadFile(f.path); err != nil {
			return fmt.Errorf("%s: %w", f.what, err)
		}
	}
	return nil
}
