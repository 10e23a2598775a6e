package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// runCmd runs the command in-process with env as its environment.
func runCmd(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var o, e bytes.Buffer
	err = run(ctx, args, func(k string) string { return env[k] }, strings.NewReader(""), &o, &e)
	return o.String(), e.String(), err
}

func TestSplitFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("target", "", "")
	fs.Bool("dry-run", false, "")
	fs.Duration("wait", 0, "")
	tests := []struct {
		name              string
		args              []string
		flags, positional []string
	}{
		{"flags first", []string{"--target", "k", "u1"}, []string{"--target", "k"}, []string{"u1"}},
		{"flags last", []string{"u1", "--target", "k"}, []string{"--target", "k"}, []string{"u1"}},
		{"interleaved", []string{"u1", "-dry-run", "u2", "--wait=1s", "u3"}, []string{"-dry-run", "--wait=1s"}, []string{"u1", "u2", "u3"}},
		{"bool takes no value", []string{"--dry-run", "u1"}, []string{"--dry-run"}, []string{"u1"}},
		{"a value that looks like a flag", []string{"--target", "-x", "u1"}, []string{"--target", "-x"}, []string{"u1"}},
		{"dash is an argument", []string{"-", "--dry-run"}, []string{"--dry-run"}, []string{"-"}},
		{"double dash ends flags", []string{"u1", "--", "--target", "u2"}, nil, []string{"u1", "--target", "u2"}},
		{"unknown flag left for Parse", []string{"--bogus", "u1"}, []string{"--bogus"}, []string{"u1"}},
		{"missing value at the end", []string{"u1", "--target"}, []string{"--target"}, []string{"u1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flags, pos := splitFlags(fs, tt.args)
			if !reflect.DeepEqual(flags, tt.flags) || !reflect.DeepEqual(pos, tt.positional) {
				t.Fatalf("splitFlags(%q) = %q, %q; want %q, %q", tt.args, flags, pos, tt.flags, tt.positional)
			}
		})
	}
}

func TestVersionSpellings(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version", "-v"} {
		stdout, stderr, err := runCmd(t, nil, arg)
		if err != nil || stdout != "mirrorworker "+version+"\n" || stderr != "" {
			t.Errorf("%s: %v, stdout %q, stderr %q", arg, err, stdout, stderr)
		}
	}
}

func TestTopLevelUsage(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		exit   int
		err    string // in the error
		stderr string // in stderr
		stdout string // in stdout: help asked for is the output
	}{
		{"no subcommand", nil, 2, "missing subcommand", "usage: mirrorworker <subcommand>", ""},
		{"help", []string{"help"}, 0, "", "", "docs/contract.md"},
		{"--help", []string{"--help"}, 0, "", "", "usage: mirrorworker <subcommand>"},
		{"help names a subcommand", []string{"help", "enqueue"}, 0, "", "", "usage: mirrorworker enqueue"},
		{"a subcommand's -h", []string{"run", "-h"}, 0, "", "", "-floor duration"},
		{"a subcommand's --help after a flag", []string{"status", "--json", "--help"}, 0, "", "", "usage: mirrorworker status"},
		{"unknown subcommand lists them", []string{"start"}, 2, `unknown subcommand "start": want one of dlq, enqueue, get, loadtest, pause, policy, replay, resume, run, status, stub-origin, verify, version`, "", ""},
		{"flag before the subcommand", []string{"--data-dir", "x", "run"}, 2, `"--data-dir" before the subcommand: flags go after it`, "", ""},
		{"a flag error with -h is still an error", []string{"run", "--flor", "1s", "-h"}, 2, "unknown flag --flor: did you mean --floor?", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, err := runCmd(t, nil, tt.args...)
			if exitCode(err) != tt.exit {
				t.Fatalf("exit %d (%v), want %d", exitCode(err), err, tt.exit)
			}
			if tt.err != "" && !strings.Contains(err.Error(), tt.err) {
				t.Errorf("error %q, want %q in it", err, tt.err)
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, stderr)
			}
			if !strings.Contains(stdout, tt.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdout, stdout)
			}
			if tt.stdout != "" && stderr != "" {
				t.Errorf("help asked for wrote on stderr: %q", stderr)
			}
		})
	}
}

// TestHelpReadsAsTyped: every subcommand's help shows sizes with units and
// names each placeholder (no bare "value"), and lists a deprecated spelling
// only as such.
func TestHelpReadsAsTyped(t *testing.T) {
	for _, sub := range sortedNames(commands()) {
		if sub == "version" {
			continue
		}
		t.Run(sub, func(t *testing.T) {
			help, _, err := runCmd(t, nil, sub, "-h")
			if err != nil {
				t.Fatalf("%s -h: %v", sub, err)
			}
			if m := regexp.MustCompile(`(?m)^  -\S+ value$`).FindString(help); m != "" {
				t.Errorf("placeholder without a name: %q", m)
			}
			if regexp.MustCompile(`(?m)^  -connect-timeout\b`).MatchString(help) {
				t.Errorf("the deprecated --connect-timeout is listed as a flag:\n%s", help)
			}
		})
	}
	help, _, _ := runCmd(t, nil, "run", "-h")
	for _, want := range []string{
		"-max-body-size size", "(default 16GiB)", "-jobs-max-bytes size",
		"-origin-connect-timeout duration",
		"Deprecated, still accepted with a warning: --connect-timeout (use --origin-connect-timeout).",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("run -h lacks %q", want)
		}
	}
	help, _, _ = runCmd(t, nil, "enqueue", "-h")
	for _, want := range []string{"-nats-connect-timeout duration", "--connect-timeout (use --nats-connect-timeout)", "Flags may come before or after the URLs"} {
		if !strings.Contains(help, want) {
			t.Errorf("enqueue -h lacks %q", want)
		}
	}
}

// TestDeprecatedConnectTimeout: the old spelling still sets what it meant
// in each command (the origin in run, NATS in enqueue), from the command
// line or the environment, with a warning; the new name wins when both
// are given.
func TestDeprecatedConnectTimeout(t *testing.T) {
	// run: the value reaches the origin timeout, whose check rejects 0.
	_, stderr, err := runCmd(t, nil, "run", "--connect-timeout", "0s")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--origin-connect-timeout 0s: want more than 0") {
		t.Fatalf("run --connect-timeout 0s: %v", err)
	}
	if !strings.Contains(stderr, "warning: --connect-timeout is deprecated: use --origin-connect-timeout (or MIRRORWORKER_ORIGIN_CONNECT_TIMEOUT) instead") {
		t.Errorf("no deprecation warning: %q", stderr)
	}
	_, stderr, err = runCmd(t, map[string]string{"MIRRORWORKER_CONNECT_TIMEOUT": "0s"}, "run")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--origin-connect-timeout 0s") ||
		!strings.Contains(stderr, "warning: MIRRORWORKER_CONNECT_TIMEOUT is deprecated") {
		t.Fatalf("MIRRORWORKER_CONNECT_TIMEOUT=0s: %v; stderr %q", err, stderr)
	}
	_, stderr, err = runCmd(t, nil, "run", "--connect-timeout", "0s", "--origin-connect-timeout", "-1s")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--origin-connect-timeout -1s") ||
		!strings.Contains(stderr, "--connect-timeout is deprecated and ignored: --origin-connect-timeout is given too") {
		t.Fatalf("both given: %v; stderr %q", err, stderr)
	}

	// enqueue: the value is the NATS timeout. Nothing listens on port 1, and
	// the error comes back well within the 20 s of runCmd, not after 10 s.
	start := time.Now()
	_, stderr, err = runCmd(t, nil, "enqueue", "http://a.example/", "--connect-timeout", "300ms", "--nats-url", "nats://127.0.0.1:1")
	if err == nil || exitCode(err) == 2 {
		t.Fatalf("enqueue against nothing: %v", err)
	}
	if !strings.Contains(stderr, "warning: --connect-timeout is deprecated: use --nats-connect-timeout") {
		t.Errorf("no deprecation warning: %q", stderr)
	}
	t.Logf("enqueue gave up after %s", time.Since(start).Round(time.Millisecond))
}

func TestByteSizeString(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 1500: "1500", 1 << 10: "1KiB", 16 << 30: "16GiB", 3 << 40: "3TiB", 1536 << 20: "1536MiB", 1e9: "1000000000"} {
		b := byteSize(in)
		if got := b.String(); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", in, got, want)
		}
		var back byteSize
		if err := back.Set(b.String()); err != nil || back != b {
			t.Errorf("%q does not parse back to %d: %v, %d", b.String(), in, err, back)
		}
	}
}

// TestLoggerOutput: console logs carry no colour codes off a terminal,
// timestamps have milliseconds, and durations carry their unit.
func TestLoggerOutput(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, format := range []string{"console", "json"} {
		log, err := newLogger(f, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		log.Warn().Dur("retry_in", 1500*time.Millisecond).Msg("format " + format)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("log:\n%s", b)
	}
	if strings.Contains(lines[0], "\x1b[") {
		t.Errorf("console log to a file has escape codes: %q", lines[0])
	}
	ms := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}`)
	if !ms.MatchString(lines[0]) || !strings.Contains(lines[0], "retry_in=1.5s") {
		t.Errorf("console line %q: want a millisecond timestamp and retry_in=1.5s", lines[0])
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &m); err != nil {
		t.Fatal(err)
	}
	if s, _ := m[zerolog.TimestampFieldName].(string); !ms.MatchString(s) || m["retry_in"] != "1.5s" {
		t.Errorf("json line %q: want a millisecond timestamp and \"retry_in\":\"1.5s\"", lines[1])
	}
}
