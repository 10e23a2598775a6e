package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/dirlock"
)

// TestLocalWorkerHint: a command that cannot reach the worker of a data
// directory says what the directory tells (issue 36 item 7: a bare
// connection error while the one worker on the embedded default was down).
func TestLocalWorkerHint(t *testing.T) {
	tests := []struct {
		name   string
		store  bool            // <data-dir>/nats exists
		holder *dirlock.Holder // a worker holds the lock
		want   string          // in the hint; "" for none
	}{
		{"no worker ever ran there", false, nil, ""},
		{"the worker is down", true, nil, "is not running, and its embedded NATS server, which holds the queue"},
		{"the worker listens in-process only", true, &dirlock.Holder{PID: 42}, "(pid 42) runs with no client address (--embedded-listen is empty)"},
		{"the worker runs and listens", true, &dirlock.Holder{PID: 42, NATSURL: "nats://127.0.0.1:4222"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.store {
				if err := os.Mkdir(filepath.Join(dir, "nats"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tt.holder != nil {
				l, err := dirlock.Exclusive(filepath.Join(dir, broker.StoreLockFile), *tt.holder)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release()
			}
			got := localWorkerHint(dir)
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("hint %q, want %q", got, tt.want)
			}
		})
	}
}
