// Package brokertest runs a real embedded JetStream server for a test, the
// way every package's tests need one: in a temporary store, on an
// in-process connection, everything stopped with the test.
//
// Start and JetStream leave the server empty; Streams adds mirrorworker's
// streams (jobs.EnsureStreams). It is for tests only.
package brokertest

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/faultproxy"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// Start starts an embedded server with o (an empty StoreDir is a directory
// of the test's own) and shuts it down when the test ends.
func Start(t testing.TB, o broker.EmbeddedOptions) *broker.Embedded {
	t.Helper()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	e, err := broker.StartEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

// JetStream connects to e in-process, named after the test, and returns a
// JetStream client and its connection, closed when the test ends.
func JetStream(t testing.TB, e *broker.Embedded) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	nc, err := e.Connect(t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return client(t, nc), nc
}

// client is a JetStream client on nc, which is closed when the test ends.
func client(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Streams starts an embedded server of the test's own with mirrorworker's
// streams (jobs.EnsureStreams with the defaults) and returns a client on
// it; everything stops with the test.
func Streams(t testing.TB) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	js, nc := JetStream(t, Start(t, broker.EmbeddedOptions{}))
	if err := jobs.EnsureStreams(Context(t), js, nil); err != nil {
		t.Fatal(err)
	}
	return js, nc
}

// Context is a context that ends with the test, or after 50 s: a limit
// for a test's calls to the server far beyond what they take on a busy
// machine, so that a lost answer fails the test instead of hanging it.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// StartWithPassword starts a plain NATS server (no JetStream) on a free
// loopback port that admits only user with password, and returns its URL:
// for the tests of a refused authorization. It stops with the test.
func StartWithPassword(t testing.TB, user, password string) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT,
		Username: user, Password: password,
		NoSigs: true, NoLog: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		t.Fatal("nats server with a password: not ready after 30s")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv.ClientURL()
}

// ThroughProxy connects to e (started with a Listen address) through a
// fault proxy of the test's own, reconnecting every reconnectWait for as
// long as it takes, and returns the proxy and a JetStream client on that
// connection; everything is closed when the test ends.
func ThroughProxy(t testing.TB, e *broker.Embedded, reconnectWait time.Duration) (*faultproxy.Proxy, jetstream.JetStream, *nats.Conn) {
	t.Helper()
	u, err := url.Parse(e.ClientURL())
	if err != nil || u.Host == "" {
		t.Fatalf("server's client URL %q: %v (started without Listen?)", e.ClientURL(), err)
	}
	px, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	nc, err := nats.Connect("nats://"+px.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(reconnectWait))
	if err != nil {
		t.Fatal(err)
	}
	return px, client(t, nc), nc
}
