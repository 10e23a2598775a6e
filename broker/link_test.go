package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/broker"
)

// TestLinkFollowsTheConnection: Up is IsConnected's answer through a lost
// server, its return on the same port, and the connection's close.
func TestLinkFollowsTheConnection(t *testing.T) {
	dir := t.TempDir()
	start := func(listen string) *broker.Embedded {
		t.Helper()
		e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: dir, Listen: listen})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := start("127.0.0.1:0")
	addr := e.ClientURL()
	nc, err := nats.Connect(addr, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		e.Shutdown()
		t.Fatal(err)
	}
	defer nc.Close()
	l := broker.NewLink(nc)
	if !l.Up() {
		t.Fatal("Up is false on a connected connection")
	}

	e.Shutdown()
	waitLink(t, l, nc, false, "the server shut down")

	e = start(strings.TrimPrefix(addr, "nats://")) // the same port: the client reconnects
	defer e.Shutdown()
	waitLink(t, l, nc, true, "the server back")

	nc.Close()
	waitLink(t, l, nc, false, "the connection closed")
}

// waitLink waits until l.Up() is want, and checks that it agrees with
// IsConnected then.
func waitLink(t *testing.T, l *broker.Link, nc *nats.Conn, want bool, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for l.Up() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: Up is %v after 20 s, IsConnected %v", what, !want, nc.IsConnected())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if nc.IsConnected() != want {
		t.Fatalf("%s: Up is %v, IsConnected %v", what, want, nc.IsConnected())
	}
}
