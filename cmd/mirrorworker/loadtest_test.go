package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLoadtestCommand runs a short load test end to end through the command:
// flags, the real profile file, an embedded JetStream, the stub origin, two
// workers, the table on stdout and both report files.
func TestLoadtestCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a load test")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"loadtest",
		"--jobs", "40", "--authorities", "2", "--workers", "2",
		"--strategy", "hostpacer,fixed",
		"--profile", filepath.Join("..", "..", "testdata", "profiles", "loadtest-throttling.json"),
		"--report", filepath.Join(dir, "out"), "--scratch-dir", dir,
		"--time-limit", "60s", "--progress", "line",
	}, noEnv, strings.NewReader(""), &stdout, &stderr)
	if err != nil {
		t.Fatalf("loadtest: %v\nstderr:\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"strategy", "goodput", "hostpacer", "fixed", "report.html"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr.String(), "[1/2 hostpacer] drained") {
		t.Errorf("no progress line for hostpacer on stderr:\n%s", stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "out", "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Strategy   string `json:"strategy"`
			Drained    bool   `json:"drained"`
			JobsStored int    `json:"jobs_stored"`
			Early      int64  `json:"early"`
			Requests   int64  `json:"requests"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("report has %d results, want 2", len(rep.Results))
	}
	for _, r := range rep.Results {
		if !r.Drained || r.JobsStored != 40 || r.Requests < 40 {
			t.Errorf("%s: drained=%v stored=%d requests=%d, want every job stored", r.Strategy, r.Drained, r.JobsStored, r.Requests)
		}
	}
	if rep.Results[0].Early != 0 {
		t.Errorf("hostpacer sent %d requests while told to wait", rep.Results[0].Early)
	}
	if _, err := os.Stat(filepath.Join(dir, "out", "report.html")); err != nil {
		t.Error(err)
	}
}

func TestLoadtestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--strategy", "tokenbucket"},
		{"--jobs", "0"},
		{"--progress", "fancy"},
		{"--authorities", "2", "--skew", "0.1"},
		{"stray"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			err := run(context.Background(), append([]string{"loadtest", "--report", t.TempDir(),
				"--profile", filepath.Join("..", "..", "testdata", "profiles", "loadtest-throttling.json")}, args...),
				noEnv, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
			var ec exitCoder
			if !errors.As(err, &ec) || ec.ExitCode() != 2 {
				t.Fatalf("err = %v, want a usage error (exit 2)", err)
			}
		})
	}
}
