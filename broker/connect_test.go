package broker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
)

// TestConnectFailsAtOnce: what a retry cannot fix fails at once, before
// the context's deadline, naming the file or the credentials and carrying
// the server's words; only an unreachable server is retried (and heard).
func TestConnectFailsAtOnce(t *testing.T) {
	e := brokertest.Start(t, broker.EmbeddedOptions{Listen: "127.0.0.1:0"})
	dir := t.TempDir()
	placeholder := filepath.Join(dir, "placeholder.creds")
	if err := os.WriteFile(placeholder, []byte("placeholder\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.creds")
	authURL := brokertest.StartWithPassword(t, "mirror", "s3cret")
	tests := []struct {
		name string
		o    broker.ConnectOptions
		want []string
		is   error
	}{
		{"missing credentials file", broker.ConnectOptions{URL: e.ClientURL(), CredsFile: missing},
			[]string{"credentials file", missing, "no such file"}, os.ErrNotExist},
		{"credentials file is a directory", broker.ConnectOptions{URL: e.ClientURL(), CredsFile: dir},
			[]string{"credentials file", dir, "is a directory"}, nil},
		{"placeholder credentials", broker.ConnectOptions{URL: e.ClientURL(), CredsFile: placeholder},
			[]string{placeholder, "no NATS user JWT", "placeholder"}, nil},
		{"missing nkey seed", broker.ConnectOptions{URL: e.ClientURL(), NKeyFile: missing},
			[]string{"NKey seed file", missing}, os.ErrNotExist},
		{"missing TLS CA", broker.ConnectOptions{URL: e.ClientURL(), TLSCA: missing},
			[]string{"TLS CA file", missing}, os.ErrNotExist},
		{"wrong password", broker.ConnectOptions{URL: authURL, User: "mirror", Password: "wrong"},
			[]string{"Authorization Violation", `user "mirror"`}, nats.ErrAuthorization},
		{"no credentials for a server that wants them", broker.ConnectOptions{URL: authURL},
			[]string{"Authorization Violation", "pass --nats-creds"}, nats.ErrAuthorization},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			retries := 0
			tt.o.OnRetry = func(int, error) { retries++ }
			nc, err := broker.Connect(ctx, tt.o)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if ctx.Err() != nil || retries > 0 {
				t.Fatalf("retried (%d times, context %v) instead of failing at once: %v", retries, ctx.Err(), err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
		})
	}

	t.Run("right password", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		nc, err := broker.Connect(ctx, broker.ConnectOptions{URL: authURL, User: "mirror", Password: "s3cret"})
		if err != nil {
			t.Fatal(err)
		}
		nc.Close()
	})

	t.Run("unreachable server is retried and heard", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var heard []error
		_, err := broker.Connect(ctx, broker.ConnectOptions{URL: "nats://127.0.0.1:1", OnRetry: func(n int, err error) {
			heard = append(heard, err)
			if n == 2 {
				cancel()
			}
		}})
		if !errors.Is(err, context.Canceled) || len(heard) != 2 || !broker.Retryable(heard[0]) {
			t.Fatalf("err %v after %d retries (%v)", err, len(heard), heard)
		}
	})
}

func TestClientURLFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := broker.ReadClientURL(dir); !errors.Is(err, broker.ErrNoClientURL) || !strings.Contains(err.Error(), broker.ClientURLFile) {
		t.Fatalf("empty dir: %v", err)
	}
	remove, err := broker.WriteClientURL(dir, "nats://127.0.0.1:4999")
	if err != nil {
		t.Fatal(err)
	}
	if u, err := broker.ReadClientURL(dir); err != nil || u != "nats://127.0.0.1:4999" {
		t.Fatalf("read %q, %v", u, err)
	}
	// A second worker on the same dir replaced it: the first leaves it.
	remove2, err := broker.WriteClientURL(dir, "nats://127.0.0.1:5000")
	if err != nil {
		t.Fatal(err)
	}
	remove()
	if u, err := broker.ReadClientURL(dir); err != nil || u != "nats://127.0.0.1:5000" {
		t.Fatalf("after the first one's removal: %q, %v", u, err)
	}
	remove2()
	if _, err := broker.ReadClientURL(dir); !errors.Is(err, broker.ErrNoClientURL) {
		t.Fatalf("after removal: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}
