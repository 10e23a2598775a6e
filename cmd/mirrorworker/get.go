package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/grant"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// getConfig is every flag of `mirrorworker get`.
type getConfig struct {
	nats         natsFlags
	output       string
	allowPrivate bool
}

// cmdGet is `mirrorworker get URL [-o FILE]`: one fetch in the cluster's
// pace, the example client of the grants (docs/contract.md, "Grants"):
// every hop's start is granted by the pod that owns its authority, and
// the origin's answer is reported to it, so the pods learn from it as
// from their own requests.
func cmdGet(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	var c getConfig
	fs := newFlagSet("get", stderr)
	c.nats.registerClient(fs, nil)
	fs.StringVar(&c.output, "o", "", "write the body to this `file` (atomically: it appears whole or not at all); default standard output")
	fs.BoolVar(&c.allowPrivate, "allow-private-networks", false, "allow fetching from loopback and private addresses (link-local and cloud metadata stay refused), as run's flag")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mirrorworker get [flags] URL")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Fetches one URL in the cluster's pace: the pod that serves the URL's authority grants")
		fmt.Fprintln(stderr, "the request's start (waiting out its floor, cooldown or backoff, said on standard error),")
		fmt.Fprintln(stderr, "and learns from the origin's answer as from its own. Needs a running 'mirrorworker run'.")
		fmt.Fprintln(stderr)
		printFlags(fs)
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	c.nats.markGiven(fs, getenv)
	if fs.NArg() != 1 {
		return usageError{"get: want one URL (mirrorworker get URL [-o FILE])"}
	}
	rawURL := fs.Arg(0)
	if _, err := authority.Parse(rawURL); err != nil {
		return usageError{fmt.Sprintf("get: %s: %v", rawURL, err)}
	}
	nc, err := c.nats.dial(ctx, "mirrorworker-get", "none (grants: "+grant.AskPrefix+"*)", stderr)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	defer nc.Close()
	g := &getter{
		grants:  grant.NewClient(nc, "mirrorworker-get", max(c.nats.timeout, grant.DefaultTimeout), nil), // longer than an ask is held
		fetch:   fetch.New(&fetch.Options{AllowPrivate: c.allowPrivate}),
		stderr:  stderr,
		natsURL: broker.RedactURL(c.nats.resolvedURL),
	}
	return g.get(ctx, rawURL, c.output, stdout)
}

// getter is one `mirrorworker get`.
type getter struct {
	grants  *grant.Client
	fetch   *fetch.Client
	stderr  io.Writer
	natsURL string
}

// get fetches rawURL through gate and writes its body to output (a file,
// or stdout when empty).
func (g *getter) get(ctx context.Context, rawURL, output string, stdout io.Writer) error {
	resp, err := g.fetch.Do(ctx, fetch.Request{URL: rawURL}, g.gate)
	if err != nil {
		return fmt.Errorf("get %s: %w", rawURL, err)
	}
	if resp.Body == nil {
		return fmt.Errorf("get %s: the origin answered %d (from %s)", rawURL, resp.Status, resp.FinalURL)
	}
	defer resp.Body.Close()
	if output == "" {
		if _, err := io.Copy(stdout, resp.Body); err != nil {
			return fmt.Errorf("get %s: %w", rawURL, err)
		}
		return nil
	}
	return writeAtomically(output, resp.Body)
}

// gate asks the owner of a's pace for the hop's start and returns the
// report of its answer (fetch.Gate).
func (g *getter) gate(ctx context.Context, _ int, a authority.Authority) (func(fetch.Result), error) {
	auth := a.String()
	ans, err := g.wait(ctx, auth)
	if err != nil {
		return nil, err
	}
	return func(r fetch.Result) {
		// The report outlives a cancelled fetch: the owner must learn of it.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		v, err := g.grants.Report(rctx, auth, ans, pacer.Response{Status: r.Status, Header: r.Header, Err: r.Err})
		switch {
		case err != nil:
			fmt.Fprintf(g.stderr, "warning: the answer of %s was not reported to its pod: %v\n", auth, err)
		case v.Unknown:
			fmt.Fprintf(g.stderr, "warning: %s changed pods during the request: its answer was not learned\n", auth)
		case v.Throttled:
			fmt.Fprintf(g.stderr, "%s throttles (%s): the pods wait until %s\n", auth, v.Reason, v.Until.Local().Format(time.TimeOnly))
		}
	}, nil
}

// noOwnerPatience is how long get goes on asking while pods run but none
// answers for the authority (a partition between owners): longer than a
// lease's life without renewal (jobs.DefaultLeaseTTL).
const noOwnerPatience = 30 * time.Second

// wait asks for a start until granted, saying each wait on stderr. With no
// pod serving grants at all it fails at once, saying what to do.
func (g *getter) wait(ctx context.Context, auth string) (grant.Answer, error) {
	var noOwnerSince time.Time
	for {
		a, err := g.grants.Ask(ctx, auth)
		switch {
		case err == nil && a.Granted():
			return a, nil
		case errors.Is(err, nats.ErrNoResponders):
			return grant.Answer{}, fmt.Errorf("no pod serves grants on NATS %s: start 'mirrorworker run' (or pass the --nats-url of the cluster's NATS)", g.natsURL)
		case errors.Is(err, grant.ErrNoOwner):
			if noOwnerSince.IsZero() {
				noOwnerSince = time.Now()
			} else if time.Since(noOwnerSince) > noOwnerPatience {
				return grant.Answer{}, fmt.Errorf("no pod answered for %s in %s: its partition has no owner (are the pods running? 'mirrorworker status' says): %w", auth, noOwnerPatience, err)
			}
			a = grant.Answer{Wait: time.Second, Reason: "no pod owns it yet"}
		case err != nil:
			return grant.Answer{}, err
		default:
			noOwnerSince = time.Time{}
		}
		fmt.Fprintf(g.stderr, "waiting %.1fs: %s\n", a.Wait.Seconds(), waitWhy(auth, a))
		t := time.NewTimer(a.Wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return grant.Answer{}, ctx.Err()
		case <-t.C:
		}
	}
}

// waitWhy is the wait line's reason: "127.0.0.1:18766 cooling until
// 14:59:02".
func waitWhy(auth string, a grant.Answer) string {
	s := auth + " " + a.Reason
	if !a.Until.IsZero() {
		s += " until " + a.Until.Local().Format(time.TimeOnly)
	}
	return s
}

// writeAtomically writes r to path through a temporary file in its
// directory, renamed over path once whole and synced.
func writeAtomically(path string, r io.Reader) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
