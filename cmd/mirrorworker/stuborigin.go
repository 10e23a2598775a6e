package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/mirrorworker/mirrorworker/loadtest"
	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// cmdStubOrigin serves the throttling stub origin until ctx is cancelled
// (SIGTERM). It prints one base URL a line on stdout once every listener is
// bound, so a script can read them; logs go to stderr.
func cmdStubOrigin(ctx context.Context, args []string, getenv func(string) string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("stub-origin", stderr)
	listen := fs.String("listen", "127.0.0.1:18080", "address of the first authority; the others take the next ports (port 0: any free ports)")
	authorities := fs.Int("authorities", 1, "number of authorities, one listener each")
	profile := fs.String("profile", "", "profile JSON file (required; see stuborigin/README.md and testdata/profiles/)")
	adminListen := fs.String("admin-listen", "127.0.0.1:18079", "admin listener: /metrics, /stats, /faults, /healthz (empty: none)")
	urlsFile := fs.String("urls-file", "", "also write the base URLs and the admin URL to this file as JSON")
	gapFloor := fs.Duration("gap-floor", 0, "count arrival gaps shorter than this in /stats (0: do not count)")
	logFormat := fs.String("log-format", "json", "log format: json or console")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mirrorworker stub-origin --profile FILE [--listen ADDR] [--authorities N] [--admin-listen ADDR] [--urls-file F]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("stub-origin: unexpected argument %q", fs.Arg(0))}
	}
	if *profile == "" {
		return usageError{"stub-origin: --profile is required"}
	}
	if *authorities < 1 {
		return usageError{"stub-origin: --authorities must be at least 1"}
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return usageError{"stub-origin: " + err.Error()}
	}
	// A load-test profile (the origin under "origin") serves as well as a
	// plain one, so that testdata's load-test profiles run as they are.
	lp, err := loadtest.LoadProfile(*profile)
	if err != nil {
		return fmt.Errorf("stub-origin: %w", err)
	}
	p := lp.Origin
	og, err := stuborigin.New(p, &stuborigin.Options{
		Authorities: *authorities,
		Logger:      log.With().Str("component", "stub-origin").Logger(),
		GapFloor:    *gapFloor,
	})
	if err != nil {
		return fmt.Errorf("stub-origin: %w", err)
	}
	urls, err := og.Listen(*listen)
	if err != nil {
		return fmt.Errorf("stub-origin: %w", err)
	}
	var adminURL string
	if *adminListen != "" {
		if adminURL, err = og.ListenAdmin(*adminListen); err != nil {
			og.Close()
			return fmt.Errorf("stub-origin: %w", err)
		}
	}
	if *urlsFile != "" {
		if err := writeURLsFile(*urlsFile, urls, adminURL); err != nil {
			og.Close()
			return fmt.Errorf("stub-origin: %w", err)
		}
	}
	for _, u := range urls {
		fmt.Fprintln(stdout, u)
	}
	return og.Run(ctx)
}

// stubURLs is the --urls-file format.
type stubURLs struct {
	URLs  []string `json:"urls"`
	Admin string   `json:"admin,omitempty"`
}

// writeURLsFile writes atomically, so a reader polling for the file never
// sees half of it.
func writeURLsFile(path string, urls []string, admin string) error {
	b, err := json.MarshalIndent(stubURLs{URLs: urls, Admin: admin}, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".urls-*.json")
	if err != nil {
		return fmt.Errorf("urls file: %w", err)
	}
	_, err = tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("urls file: %w", err)
	}
	return nil
}
