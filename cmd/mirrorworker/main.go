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
	"time"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	setLogFormats()
	ctx, stopNow, stop := notifyStop()
	err := runStopping(ctx, stopNow, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
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

// notifyStop returns the context that the first SIGINT or SIGTERM
// cancels (the graceful stop) and the channel that the second one closes
// (the stop ends at once: docs/adr/0032); after the second, the signals'
// default is back, so a third ends the process outright.
func notifyStop() (ctx context.Context, stopNow <-chan struct{}, stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	now := make(chan struct{})
	// The goroutine is stop's: it ends when stop is called (the command
	// returned) or after the second signal, whichever is first.
	stopped := make(chan struct{})
	go func() {
		select {
		case <-sigs:
		case <-stopped:
			return
		}
		cancel()
		select {
		case <-sigs:
		case <-stopped:
			return
		}
		signal.Stop(sigs)
		close(now)
	}()
	return ctx, now, func() { signal.Stop(sigs); close(stopped); cancel() }
}

// errSilent marks an error whose message was already printed.
var errSilent = errors.New("already reported")

// exitCoder lets a subcommand choose its exit status (2 for usage errors).
type exitCoder interface{ ExitCode() int }

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }
func (e usageError) ExitCode() int { return 2 }

// command is one subcommand: run, or stoppable for one whose graceful
// stop a second signal ends at once (docs/adr/0032), which is given the
// channel that signal closes.
type command struct {
	summary   string
	run       func(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error
	stoppable func(ctx context.Context, stopNow <-chan struct{}, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"run":         {summary: "pull mirror jobs and store them (the worker)", stoppable: cmdRun},
		"enqueue":     {summary: "publish mirror jobs (URLs as arguments or JSON lines on stdin)", run: cmdEnqueue},
		"replay":      {summary: "re-drive jobs already in the stream into a mirror target", run: cmdReplay},
		"stub-origin": {summary: "serve a throttling origin for load tests", run: cmdStubOrigin},
		"loadtest":    {summary: "run the whole system against the stub origin and report", run: cmdLoadtest},
		"dlq":         {summary: "list, show and requeue dead letters (list|show|requeue)", run: cmdDLQ},
		"version":     {summary: "print the version", run: cmdVersion},
		"get":         {summary: "fetch one URL in the cluster's pace (the pods grant its start)", run: cmdGet},
		"pause":       {summary: "stop every worker from sending requests to one authority for a while", run: cmdPause},
		"resume":      {summary: "end an operator's pause of an authority on every worker", run: cmdResume},
		"status":      {summary: "show the pods, their partitions and each busy authority's state", run: cmdStatus},
		"policy":      {summary: "change a running cluster's politeness: floors, caps, bandwidth, steps, groups (set|show|list|delete)", run: cmdPolicy},
		"verify":      {summary: "audit a mirror target: missing, corrupt and orphaned objects (--repair re-enqueues their jobs)", run: cmdVerify},
	}
}

// run runs the subcommand args name, as main does but with no second
// signal: a stop cancels ctx and its grace runs out (tests run commands
// in-process with it).
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	return runStopping(ctx, nil, args, getenv, stdin, stdout, stderr)
}

// runStopping is run with the channel a second signal closes (nil: none
// will): cancelling ctx starts a graceful stop, closing stopNow ends it at
// once.
func runStopping(ctx context.Context, stopNow <-chan struct{}, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	cmds := commands()
	if len(args) == 0 {
		printUsage(stderr, cmds)
		return usageError{"missing subcommand (see the list above)"}
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printUsage(stdout, cmds) // asked for: `mirrorworker -h | less` works
		return nil
	case "help":
		// `mirrorworker help enqueue` is `mirrorworker enqueue -h`.
		if len(args) > 1 {
			if _, ok := cmds[args[1]]; ok {
				args = []string{args[1], "-h"}
				break
			}
		}
		printUsage(stdout, cmds)
		return nil
	case "-v", "-version", "--version":
		args = []string{"version"}
	}
	c, ok := cmds[args[0]]
	if !ok {
		printUsage(stderr, cmds)
		if strings.HasPrefix(args[0], "-") {
			return usageError{fmt.Sprintf("%q before the subcommand: flags go after it, as in 'mirrorworker run %s'", args[0], args[0])}
		}
		return usageError{fmt.Sprintf("unknown subcommand %q: want one of %s", args[0], strings.Join(sortedNames(cmds), ", "))}
	}
	cmdStderr := stderr
	if helpAsked(args[1:]) {
		// Help that was asked for is the output (`run -h | grep floor`);
		// a command given -h does nothing else, and its errors are
		// returned, which main prints on stderr.
		cmdStderr = stdout
	}
	var err error
	if c.stoppable != nil {
		err = c.stoppable(ctx, stopNow, args[1:], getenv, stdin, stdout, cmdStderr)
	} else {
		err = c.run(ctx, args[1:], getenv, stdin, stdout, cmdStderr)
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// helpAsked reports whether args ask for help: -h, -help or --help
// before "--" (after it, they are arguments).
func helpAsked(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

func sortedNames(cmds map[string]command) []string {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func printUsage(w io.Writer, cmds map[string]command) {
	names := sortedNames(cmds)
	fmt.Fprintln(w, "usage: mirrorworker <subcommand> [flags] [arguments]")
	fmt.Fprintln(w)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Every flag can also be set from the environment: --data-dir is MIRRORWORKER_DATA_DIR.")
	fmt.Fprintln(w, "Flags may come before or after the arguments; '--' ends the flags.")
	fmt.Fprintln(w, "Run 'mirrorworker <subcommand> -h' for its flags; 'mirrorworker --version' for the version.")
	fmt.Fprintln(w, "The contract (job format, outcomes, metrics, command line): docs/contract.md.")
}

func cmdVersion(_ context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mirrorworker version")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Prints the version of this binary (as 'mirrorworker --version' does).")
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("version: unexpected arguments %q", fs.Args())}
	}
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
//
// Flags may come anywhere on the line, before or after the arguments
// (`enqueue URL --target key` is what people type); "--" ends the flags, so
// an argument that starts with '-' can still be given. fs.Args() holds the
// arguments in their order. A flag registered with deprecate is accepted,
// with a warning on fs.Output(), and its value moves to its replacement.
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	flags, positional := splitFlags(fs, args)
	if err := parseQuietly(fs, flags); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		// Only an unknown bare word can stop Parse early; keep it in order.
		positional = append(fs.Args(), positional...)
	}
	// Parse again with the flags already set and the arguments after "--",
	// so that fs.Args() returns them all.
	if err := fs.Parse(append([]string{"--"}, positional...)); err != nil {
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
				errs = append(errs, fmt.Errorf("%s=%q: %s", env, v, valueHint(f, err)))
			}
		}
	})
	if len(errs) > 0 {
		return usageError{errors.Join(errs...).Error()}
	}
	return resolveDeprecated(fs, set, getenv)
}

// parseQuietly is fs.Parse without the flag package's own printing: on a
// mistake it prints the error and then the whole usage, and the one line
// that matters scrolls away. Here a mistake is one line (with a hint: the
// flag meant, the form of a value), and only -h prints the usage.
func parseQuietly(fs *flag.FlagSet, flags []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(flags)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		if usage != nil {
			usage()
		} else {
			fmt.Fprintf(out, "usage of %s:\n", fs.Name())
			printFlags(fs)
		}
		return err
	}
	return usageError{fmt.Sprintf("%s (run '%s -h' for the flags)", flagErrorHint(fs, err), fs.Name())}
}

// flagErrorHint rewrites the flag package's error for a person: an unknown
// flag names the closest known one; a bad value says what form it takes.
func flagErrorHint(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		if near := closestFlag(fs, name); near != "" {
			return fmt.Sprintf("unknown flag --%s: did you mean --%s?", name, near)
		}
		return fmt.Sprintf("unknown flag --%s", name)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return fmt.Sprintf("--%s needs a value", strings.TrimLeft(name, "-"))
	}
	// invalid value "1" for flag -floor: parse error
	var val, name string
	if i := strings.Index(msg, " for flag -"); strings.HasPrefix(msg, "invalid value ") && i > 0 {
		val = strings.TrimPrefix(msg[:i], "invalid value ")
		name, _, _ = strings.Cut(msg[i+len(" for flag -"):], ":")
		if f := fs.Lookup(name); f != nil {
			_, cause, _ := strings.Cut(msg[i:], ": ")
			return fmt.Sprintf("--%s %s: %s", name, val, valueHint(f, errors.New(cause)))
		}
	}
	if strings.HasPrefix(msg, "invalid boolean value ") {
		return msg + " (a bool flag takes true or false, as --flag=false)"
	}
	return msg
}

// valueHint is err, the error of setting f, said with the form f wants.
func valueHint(f *flag.Flag, err error) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err.Error()
	}
	switch g.Get().(type) {
	case time.Duration:
		return "want a duration, like 1s, 500ms, 10m or 1h30m (a number needs its unit)"
	case int, int64, uint, uint64:
		return "want a whole number"
	case float64:
		return "want a number"
	case bool:
		return "want true or false"
	}
	return err.Error()
}

// closestFlag is the registered flag nearest to name (at most a third of
// its letters apart), or "".
func closestFlag(fs *flag.FlagSet, name string) string {
	best, bestD := "", len(name)/3+1
	fs.VisitAll(func(f *flag.Flag) {
		if _, old := f.Value.(*deprecatedValue); old {
			return
		}
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = 1
		}
		if d < bestD || d == bestD && best != "" && f.Name < best {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// splitFlags separates args into the flags (with their values) and the
// arguments, keeping each group's order. A word is a flag when it starts
// with '-' and is more than "-"; the word after a flag that takes a value and
// has no "=value" is its value. Unknown flags stay with the flags, for Parse
// to report. Everything after "--" is an argument.
func splitFlags(fs *flag.FlagSet, args []string) (flags, positional []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return flags, append(positional, args[i+1:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, positional
}

// deprecatedValue marks a flag kept for old command lines and environments:
// parseFlags moves its value to the flag named by replacement, unless that
// one is given too, and warns either way.
type deprecatedValue struct {
	flag.Value
	replacement string
}

// deprecate registers old as a deprecated spelling of the flag named
// replacement (already registered), with the same type and default.
func deprecate(fs *flag.FlagSet, old, replacement string) {
	fs.Var(&deprecatedValue{Value: &stringValue{}, replacement: replacement}, old, "deprecated: use --"+replacement)
}

// printFlags is fs.PrintDefaults without the deprecated spellings, which
// are named after the list instead: help shows what to type today.
func printFlags(fs *flag.FlagSet) {
	var old []string
	fs.VisitAll(func(f *flag.Flag) {
		if d, ok := f.Value.(*deprecatedValue); ok {
			old = append(old, fmt.Sprintf("--%s (use --%s)", f.Name, d.replacement))
		}
	})
	if len(old) == 0 {
		fs.PrintDefaults()
		return
	}
	// PrintDefaults has no filter: print into a copy of the set without them.
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shown.SetOutput(fs.Output())
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(*deprecatedValue); !ok {
			shown.Var(f.Value, f.Name, f.Usage)
		}
	})
	shown.PrintDefaults()
	fmt.Fprintf(fs.Output(), "\nDeprecated, still accepted with a warning: %s.\n", strings.Join(old, ", "))
}

// stringValue holds a deprecated flag's text until it is handed on; the
// replacement's own Set checks it.
type stringValue struct{ s string }

func (s *stringValue) String() string     { return s.s }
func (s *stringValue) Set(v string) error { s.s = v; return nil }

// resolveDeprecated hands each deprecated flag given (on the command line,
// in set, or in the environment) to its replacement, and warns.
func resolveDeprecated(fs *flag.FlagSet, set map[string]bool, getenv func(string) string) error {
	var errs []string
	given := func(name string) bool { return set[name] || getenv(envName(name)) != "" }
	fs.VisitAll(func(f *flag.Flag) {
		d, ok := f.Value.(*deprecatedValue)
		if !ok || !given(f.Name) {
			return
		}
		where := "--" + f.Name
		if !set[f.Name] {
			where = envName(f.Name)
		}
		if given(d.replacement) {
			fmt.Fprintf(fs.Output(), "warning: %s is deprecated and ignored: --%s is given too (%s)\n", where, d.replacement, envName(d.replacement))
			return
		}
		if err := fs.Lookup(d.replacement).Value.Set(d.Value.String()); err != nil {
			errs = append(errs, fmt.Sprintf("%s %q: %s", where, d.Value.String(), valueHint(fs.Lookup(d.replacement), err)))
			return
		}
		fmt.Fprintf(fs.Output(), "warning: %s is deprecated: use --%s (or %s) instead\n", where, d.replacement, envName(d.replacement))
	})
	if len(errs) > 0 {
		return usageError{strings.Join(errs, "; ")}
	}
	return nil
}

func envName(flagName string) string {
	return "MIRRORWORKER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
