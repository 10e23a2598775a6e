// Package brokertest runs a real embedded JetStream server for a test, the
// way every package's tests need one: in a temporary store, on an
// in-process connection, everything stopped with the test.
//
// It does not create mirrorworker's streams (jobs.EnsureStreams does), and
// it is for tests only.
package brokertest

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker"
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
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, nc
}
