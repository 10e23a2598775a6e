package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEmbeddedInProcessAndTCP(t *testing.T) {
	e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	if !strings.HasPrefix(e.ClientURL(), "nats://127.0.0.1:") {
		t.Fatalf("ClientURL = %q", e.ClientURL())
	}
	nc, err := e.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}

	// A TCP client sees the same JetStream.
	tcp, err := broker.Connect(ctx, broker.ConnectOptions{URL: e.ClientURL(), Name: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	js2, _ := jetstream.New(tcp)
	if _, err := js2.Publish(ctx, "t.x", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
	}
}

func TestEmbeddedNoListen(t *testing.T) {
	e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	if e.ClientURL() != "" {
		t.Fatalf("ClientURL = %q, want empty for an in-process-only server", e.ClientURL())
	}
}

func TestConnectErrorRedactsCredentials(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	// Nothing listens on port 1 of loopback.
	_, err := broker.Connect(ctx, broker.ConnectOptions{URL: "nats://alice:s3cret@127.0.0.1:1"})
	if err == nil {
		t.Fatal("connect to a closed port succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{name: "no credentials", in: "nats://127.0.0.1:4222", want: "nats://127.0.0.1:4222"},
		{name: "user and password", in: "nats://alice:s3cret@nats-1:4222", want: "nats://redacted@nats-1:4222"},
		{name: "token", in: "nats://s3cret@nats-1:4222", want: "nats://redacted@nats-1:4222"},
		{name: "list", in: "nats://a:s3cret@n1:4222, nats://n2:4222", want: "nats://redacted@n1:4222,nats://n2:4222"},
		{name: "unparseable", in: "nats://alice:s3cret@[bad", want: "<unparseable url>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := broker.RedactURL(tt.in)
			if got != tt.want {
				t.Fatalf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if strings.Contains(got, "s3cret") {
				t.Fatalf("RedactURL(%q) leaks the secret: %q", tt.in, got)
			}
		})
	}
}
