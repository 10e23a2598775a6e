package main

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOnlyMainReadsTheProcessEnvironment: main.go hands os.Getenv to run,
// and everything else reads the environment through the getenv it was
// given, so that a test (or an in-process run) sets a hook without setting
// the process's variables.
func TestOnlyMainReadsTheProcessEnvironment(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if name == "main.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "os" {
				switch sel.Sel.Name {
				case "Getenv", "LookupEnv", "Environ":
					t.Errorf("%s: os.%s: read the getenv run was given", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}

// TestStopNowIsGivenToRun: the channel a second signal closes reaches
// `run` as a parameter (main passes notifyStop's; docs/adr/0032): in
// process, a stop whose grace (2 minutes) waits for a long download ends
// as soon as it closes, with an error (a stop cut short) and the job
// handed back. TestProcessCtrlCDuringALongDownload checks the same with
// real signals.
func TestStopNowIsGivenToRun(t *testing.T) {
	t.Parallel()
	origin := newSlowOrigin(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopNow := make(chan struct{})
	log := newLogWatch()
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		done <- runStopping(ctx, stopNow, []string{"run", "--data-dir", t.TempDir(), "--embedded-listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
			"--allow-private-networks", "--floor", "0", "--shutdown-grace", "2m"}, noEnv, strings.NewReader(""), io.Discard, log)
		close(exited)
	}()
	si := log.waitStart(t, exited)
	var errOut strings.Builder
	if err := run(ctx, []string{"enqueue", "--nats-url", si.NATSURL, origin.URL + "/big.iso"}, noEnv, strings.NewReader(""), io.Discard, &errOut); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errOut.String())
	}
	waitFor(t, 30*time.Second, "the download under way", func() bool { return origin.sent.Load() >= 1<<20 })
	cancel()
	waitFor(t, 10*time.Second, "the stop's report of the fetch in flight", func() bool { return strings.Contains(log.String(), "waiting up to ") })
	close(stopNow)
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("a stop cut short returned nil")
		}
	case <-time.After(30 * time.Second): // a guard: the grace is 2 minutes
		t.Fatal("run did not return when stopNow closed")
	}
	if l := log.logLine("worker stopped", nil); l == nil || l["handed_back"] != float64(1) {
		t.Errorf("the worker's stop line %v, want handed_back 1", l)
	}
}
