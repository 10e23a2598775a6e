package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestFlagMistakeIsOneLine: a mistyped flag or a bad value prints no usage,
// only the error, with the flag meant or the form of the value, and where
// the help is.
func TestFlagMistakeIsOneLine(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"mistyped flag", []string{"enqueue", "--nats-ulr", "nats://127.0.0.1:1", "https://a.example/"}, "unknown flag --nats-ulr: did you mean --nats-url? (run 'mirrorworker enqueue -h' for the flags)"},
		{"prefix of a flag", []string{"run", "--allow-private"}, "did you mean --allow-private-networks?"},
		{"nothing near", []string{"status", "--zzzzzzzz"}, "unknown flag --zzzzzzzz (run 'mirrorworker status -h' for the flags)"},
		{"duration without unit", []string{"run", "--floor", "1"}, `--floor "1": want a duration, like 1s`},
		{"duration of dlq", []string{"dlq", "list", "--nats-connect-timeout", "5"}, `--nats-connect-timeout "5": want a duration, like 1s`},
		{"number", []string{"run", "--concurrency", "many"}, `--concurrency "many": want a whole number`},
		{"flag without value", []string{"pause", "--for"}, "--for needs a value"},
		{"dlq since", []string{"dlq", "list", "--since", "a week"}, `--since "a week": want a duration, like 90m, 24h or 7d`},
		{"target sync", []string{"run", "--target-sync", "fsync"}, `--target-sync "fsync": want auto, file or filesystem`},
		{"ack batch", []string{"run", "--ack-batch", "40s"}, `--ack-batch 40s: want 0 or more, and less than half of --ack-wait (1m0s)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, err := runCmd(t, nil, tt.args...)
			if exitCode(err) != 2 || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("exit %d, error %v; want exit 2 saying %q", exitCode(err), err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("the error is more than one line: %q", err)
			}
			if stderr != "" {
				t.Errorf("printed before the error (usage?):\n%s", stderr)
			}
		})
	}
	// The same hint for a value from the environment.
	_, _, err := runCmd(t, map[string]string{"MIRRORWORKER_FLOOR": "1"}, "run")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), `MIRRORWORKER_FLOOR="1": want a duration, like 1s`) {
		t.Errorf("MIRRORWORKER_FLOOR=1: %v", err)
	}
}

// TestVersionHelp: version -h is help, not the version.
func TestVersionHelp(t *testing.T) {
	stdout, stderr, err := runCmd(t, nil, "version", "-h")
	if err != nil || stderr != "" || !strings.HasPrefix(stdout, "usage: mirrorworker version") {
		t.Fatalf("version -h: err %v, stdout %q, stderr %q", err, stdout, stderr)
	}
	if _, _, err := runCmd(t, nil, "version", "extra"); exitCode(err) != 2 {
		t.Errorf("version extra: %v", err)
	}
}

// TestOneNATSTimeoutName: every command that reaches NATS takes
// --nats-connect-timeout; the old names warn and still work.
func TestOneNATSTimeoutName(t *testing.T) {
	for _, cmd := range [][]string{{"enqueue"}, {"replay"}, {"dlq", "list"}, {"dlq", "show"}, {"dlq", "requeue"}, {"pause"}, {"resume"}, {"status"}} {
		help, _, err := runCmd(t, nil, append(cmd, "-h")...)
		if err != nil {
			t.Fatalf("%s -h: %v", cmd, err)
		}
		if !strings.Contains(help, "-nats-connect-timeout duration") {
			t.Errorf("%s -h has no --nats-connect-timeout:\n%s", cmd, help)
		}
		// Value names are words, never a command line picked out of
		// backquotes in the help text.
		if m := regexp.MustCompile(`(?m)^  -\S+ (\S+ \S+.*)$`).FindString(help); m != "" {
			t.Errorf("%s -h: a flag with a value name of several words: %q", cmd, m)
		}
	}
	old := []struct {
		args []string
		name string
	}{
		{[]string{"dlq", "list", "--connect-timeout", "300ms"}, "--connect-timeout"},
		{[]string{"status", "--nats-timeout", "300ms"}, "--nats-timeout"},
		{[]string{"pause", "--authority", "a.example:443", "--for", "1m", "--nats-timeout", "300ms"}, "--nats-timeout"},
	}
	for _, o := range old {
		t0 := time.Now()
		_, stderr, err := runCmd(t, nil, append(o.args, "--nats-url", "nats://127.0.0.1:1")...)
		if err == nil || exitCode(err) == 2 {
			t.Errorf("%s: want a connection failure, got %v", o.args, err)
		}
		if !strings.Contains(stderr, "warning: "+o.name+" is deprecated: use --nats-connect-timeout") {
			t.Errorf("%s: no deprecation warning: %q", o.args, stderr)
		}
		if took := time.Since(t0); took > 15*time.Second {
			t.Errorf("%s: the 300ms timeout was not applied (took %s)", o.args, took)
		}
	}
}

// TestEnqueueValidatesBeforeConnecting: a bad URL argument is reported as
// such, with nothing listening at --nats-url: enqueue does not try NATS
// for jobs it would not publish.
func TestEnqueueValidatesBeforeConnecting(t *testing.T) {
	r := runEnqueue(t, nil, "", "--nats-url", "nats://127.0.0.1:1", "--nats-connect-timeout", "30s", "htp://a.example/x")
	if r.err == nil || r.err.Error() != "enqueue: 1 rejected" || !strings.Contains(r.stderr, "argument 1: url:") {
		t.Fatalf("err %v, stderr %q", r.err, r.stderr)
	}
	if strings.Contains(r.stderr, "connect") || strings.Contains(r.err.Error(), "connect") {
		t.Errorf("tried to connect: %q", r.stderr)
	}
}

// TestLoadtestScratchDirMissing: a --scratch-dir that does not exist is one
// usage error, not a report of rows of "error".
func TestLoadtestScratchDirMissing(t *testing.T) {
	missing := t.TempDir() + "/not-there"
	stdout, _, err := runCmd(t, nil, "loadtest", "--scratch-dir", missing, "--report", t.TempDir()+"/r.html")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--scratch-dir "+missing+": no such directory (create it first: mkdir -p "+missing+")") {
		t.Fatalf("exit %d: %v", exitCode(err), err)
	}
	if stdout != "" {
		t.Errorf("stdout %q", stdout)
	}
}
