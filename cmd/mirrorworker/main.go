// Command mirrorworker pulls mirror jobs from NATS JetStream, fetches each URL
// politely and stores the bytes in a mirror target.
//
// This file only dispatches subcommands; each subcommand's flags and wiring
// live in its own file. Everything is passed in (args, environment, output
// streams) so that tests can run the command in-process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, errSilent) {
			fmt.Fprintln(os.Stderr, "mirrorworker:", err)
		}
		var ec exitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

// errSilent marks an error whose message was already printed.
var errSilent = errors.New("already reported")

// exitCoder lets a subcommand choose its exit status (2 for usage errors).
type exitCoder interface{ ExitCode() int }

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }
func (e usageError) ExitCode() int { return 2 }

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"run":         {"pull mirror jobs and store them (the worker)", cmdRun},
		"enqueue":     {"publish mirror jobs (URLs as arguments or JSON lines on stdin)", cmdEnqueue},
		"replay":      {"re-drive jobs already in the stream into a mirror target", cmdReplay},
		"stub-origin": {"serve a throttling origin for load tests", cmdStubOrigin},
		"loadtest":    {"run the whole system against the stub origin and report", cmdLoadtest},
		"dlq":         {"list, show and requeue dead letters (list|show|requeue)", cmdDLQ},
		"version":     {"print the version", cmdVersion},
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr, cmds)
		if len(args) == 0 {
			return usageError{"missing subcommand"}
		}
		return nil
	}
	c, ok := cmds[args[0]]
	if !ok {
		printUsage(stderr, cmds)
		return usageError{fmt.Sprintf("unknown subcommand %q", args[0])}
	}
	err := c.run(ctx, args[1:], getenv, stdin, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

func printUsage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: mirrorworker <subcommand> [flags]")
	fmt.Fprintln(w)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Every flag can also be set from the environment: --data-dir is MIRRORWORKER_DATA_DIR.")
	fmt.Fprintln(w, "Run 'mirrorworker <subcommand> -h' for its flags.")
}

func cmdVersion(_ context.Context, _ []string, _ func(string) string, _ io.Reader, stdout, _ io.Writer) error {
	_, err := fmt.Fprintf(stdout, "mirrorworker %s\n", version)
	return err
}

// newFlagSet returns a FlagSet that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mirrorworker "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args and then fills every flag not given on the command
// line from the environment variable MIRRORWORKER_<NAME> (upper case, '-' as
// '_'). The command line wins over the environment.
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		env := envName(f.Name)
		if v := getenv(env); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
		}
	})
	if len(errs) > 0 {
		return usageError{errors.Join(errs...).Error()}
	}
	return nil
}

func envName(flagName string) string {
	return "MIRRORWORKER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
