package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// deployMetricFiles are the dashboard and the alert rules of the worker,
// whose every series must exist from the start (the stub origin's alerts
// read the stub's metrics, not the worker's).
var deployMetricFiles = []string{
	filepath.Join("..", "..", "deploy", "grafana", "mirrorworker.json"),
	filepath.Join("..", "..", "deploy", "prometheus", "mirrorworker-alerts.yml"),
}

var metricNameRE = regexp.MustCompile(`\bmirrorworker_[a-z0-9_]+`)

// deployMetricNames are the worker's series names the dashboard and the
// alert rules read, as written there (a histogram's _bucket included).
func deployMetricNames(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, f := range deployMetricFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range metricNameRE.FindAllString(string(b), -1) {
			seen[n] = true
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// scrapedNames are the series names of a /metrics page in the text
// format.
func scrapedNames(page string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(page, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			out[line[:i]] = true
		}
	}
	return out
}

// TestDashboardSeriesExportedAtStart: a worker scraped once, ready and
// before any job, exports every series the Grafana dashboard and the alert rules
// read (at zero), so that a panel of a quiet worker says 0, not "No data",
// and an alert's increase() sees the first event. The names are read from
// deploy/'s files, so the test follows the dashboard.
func TestDashboardSeriesExportedAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker")
	}
	t.Parallel()
	want := deployMetricNames(t)
	if len(want) < 20 {
		t.Fatalf("found only %d metric names in %v: %v", len(want), deployMetricFiles, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	si, log, done := runInProcess(t, ctx, "--data-dir", t.TempDir(), "--embedded-listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--worker-id", "zero")
	// Ready: its consumers are bound, so their backlog can be read.
	waitFor(t, 30*time.Second, "the worker ready", func() bool {
		code, _ := httpGet(t, si.AdminURL+"/readyz")
		return code == 200
	})
	_, page := httpGet(t, si.AdminURL+"/metrics")
	got := scrapedNames(page)
	for _, n := range want {
		if !got[n] {
			t.Errorf("%s: read by the dashboard or an alert, not exported before the first job", n)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, log)
	}
}
