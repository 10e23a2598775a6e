package broker_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// logBuf is a concurrency-safe buffer of JSON log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		out = append(out, m)
	}
	return out
}

// Issue 13, case 5: the embedded server's reports and nats.go's
// asynchronous errors arrive as zerolog JSON lines, not as plain text on
// stderr.
func TestLibraryLogsGoThroughZerolog(t *testing.T) {
	var serverLog, clientLog logBuf
	srv, err := broker.StartEmbedded(broker.EmbeddedOptions{
		StoreDir: t.TempDir(),
		Logger:   zerolog.New(&serverLog).Level(zerolog.DebugLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	if len(serverLog.lines(t)) == 0 {
		t.Error("the embedded server logged nothing through zerolog at debug level")
	}

	nc, err := srv.Connect("log-test", broker.ClientLogOptions(zerolog.New(&clientLog))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A subscriber that cannot keep up: nats.go reports a slow consumer
	// asynchronously, through the error handler.
	block := make(chan struct{})
	defer close(block)
	sub, err := nc.Subscribe("slow", func(*nats.Msg) { <-block })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(1, 1<<20); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		nc.Publish("slow", []byte("x"))
	}
	nc.Flush()
	deadline := time.Now().Add(10 * time.Second)
	for {
		found := false
		for _, m := range clientLog.lines(t) {
			if m["message"] == "NATS asynchronous error" && strings.Contains(m["error"].(string), "slow consumer") && m["subject"] == "slow" {
				found = true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no slow-consumer line in the client log: %v", clientLog.lines(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
