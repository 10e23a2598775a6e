package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
)

// TestTestHooksReadTheGivenEnvironment: run's test hooks come from the
// environment run was given, not the process's (which has neither
// variable here), and a nil getenv is no hooks.
func TestTestHooksReadTheGivenEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name           string
		env            map[string]string
		wantDepartures string
		wantFault      bool
		wantLockWait   time.Duration
	}{
		{name: "nil getenv"},
		{name: "empty", env: map[string]string{}},
		{name: "departures", env: map[string]string{departlog.Env: "/tmp/deps"}, wantDepartures: "/tmp/deps"},
		{name: "fault point", env: map[string]string{faultEnv: "parked-before-ack"}, wantFault: true},
		{name: "index lock wait", env: map[string]string{indexLockWaitEnv: "100ms"}, wantLockWait: 100 * time.Millisecond},
		{name: "index lock wait not a duration", env: map[string]string{indexLockWaitEnv: "soon"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var getenv func(string) string
			if tc.env != nil {
				getenv = func(k string) string { return tc.env[k] }
			}
			h := readTestHooks(getenv)
			if h.departures != tc.wantDepartures || (h.fault != nil) != tc.wantFault || h.indexLockWait != tc.wantLockWait {
				t.Errorf("hooks: departures %q, fault set %v, index lock wait %s; want %q, %v, %s",
					h.departures, h.fault != nil, h.indexLockWait, tc.wantDepartures, tc.wantFault, tc.wantLockWait)
			}
		})
	}
}

// TestRunLogsDeparturesToTheGivenEnvironment: `run` in process, given the
// departure log's variable only through its getenv, logs one departure per
// request there.
func TestRunLogsDeparturesToTheGivenEnvironment(t *testing.T) {
	const n = 3
	origin := newObjectOrigin(t)
	deps := filepath.Join(t.TempDir(), "departures")
	env := func(k string) string {
		if k == departlog.Env {
			return deps
		}
		return ""
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := newLogWatch()
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		done <- run(ctx, []string{"run", "--data-dir", t.TempDir(), "--embedded-listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
			"--allow-private-networks", "--floor", "0"}, env, strings.NewReader(""), io.Discard, log)
		close(exited)
	}()
	si := log.waitStart(t, exited)
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, `{"url":%q,"target":%q}`+"\n", fmt.Sprintf("%s/obj/%d", origin.URL, i), objectKey(i))
	}
	var errOut strings.Builder
	if err := run(ctx, []string{"enqueue", "--nats-url", si.NATSURL}, noEnv, strings.NewReader(lines.String()), io.Discard, &errOut); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errOut.String())
	}
	waitDrained(t, si.NATSURL, si.Mirror, n, 30*time.Second, log)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, log)
	}
	b, err := os.ReadFile(deps)
	if err != nil {
		t.Fatalf("no departure log where the given environment said: %v", err)
	}
	if got := strings.Count(string(b), "\n"); got != n {
		t.Errorf("%d departures logged, want %d:\n%s", got, n, b)
	}
	// Each answer the worker read, beside them (a 200 each).
	r, err := os.ReadFile(deps + departlog.ReadsSuffix)
	if err != nil {
		t.Fatalf("no reads beside the departure log: %v", err)
	}
	if got := strings.Count(string(r), " 200 0 "); got != n {
		t.Errorf("%d answers read logged, want %d 200s:\n%s", got, n, r)
	}
}
