package loadtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/loadtest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// sampleReport is a fixed report: two strategies, a short series with
// throttling answers, and one failed run.
func sampleReport() *loadtest.Report {
	series := func(n int, rate, limited int64) []loadtest.Point {
		ps := make([]loadtest.Point, n)
		for i := range ps {
			p := loadtest.Point{T: i, Requests: rate, Admitted: rate}
			if i%4 == 1 {
				p.Status429 = limited
				p.Requests += limited
			}
			if i == 5 {
				p.Status503 = 2
				p.Requests += 2
			}
			if limited > 10 && i >= 10 && i < 16 { // fixed: one authority banned for 6 s
				p.Banned = 1
			}
			ps[i] = p
		}
		return ps
	}
	return &loadtest.Report{
		Title:       "mirrorworker load test",
		GeneratedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Command:     "mirrorworker loadtest --jobs 200 --authorities 4 --workers 2 --strategy hostpacer,fixed,cooldown",
		Setup: loadtest.Setup{
			Jobs: 200, Authorities: 4, Workers: 2, Skew: 0.25,
			Profile: "loadtest-throttling", ProfileFile: "testdata/profiles/loadtest-throttling.json",
			Scale: 0.01, FloorSeconds: 0.1, MaxInFlight: 2, Identities: 1, AllowedRate: 8,
			Allowance:        []float64{0, 28, 36, 44, 52, 60, 68, 76, 84, 92, 100, 108, 116, 124, 132, 140, 148, 156, 164, 172, 180, 188, 196, 204, 212, 220, 228, 236, 244},
			Penalty:          "after 20 early requests within 10s: banned 6s (429, disclosed)",
			TimeLimitSeconds: 120, ObjectSize: 1024,
			GoVersion: "go1.26.0", Platform: "linux/amd64", CPUs: 2,
		},
		Notes: []string{"CPU seconds and peak heap are the whole process <shared>."},
		Results: []loadtest.Result{
			{
				Strategy: "hostpacer", Mode: loadtest.ModeProcesses, Drained: true, DrainSeconds: 25.4, JobsStored: 200, JobsPerSec: 7.87,
				AdmittedPerSec: 7.9, Goodput: 0.987, Requests: 210, Status429: 9, Status503: 1,
				DeliveriesPerJob: 1.12, CPUSeconds: 3.2, PeakHeapBytes: 48 << 20, Series: series(26, 8, 1),
				StartupSeconds: 4.25, Pods: []loadtest.PodResult{
					{ID: "loadtest-hostpacer-pod1", Requests: 110, CPUSeconds: 0.5, MaxRSSBytes: 30 << 20},
					{ID: "loadtest-hostpacer-pod2", Requests: 100, CPUSeconds: 0.4, MaxRSSBytes: 29 << 20},
				},
			},
			{
				Strategy: "fixed", Mode: loadtest.ModeInProcess, Drained: true, DrainSeconds: 27.9, JobsStored: 200, JobsPerSec: 7.17,
				AdmittedPerSec: 7.2, Goodput: 0.9, Requests: 600, Status429: 400, Early: 310, DeparturesLogged: true, GapsBelowFloor: 0,
				Bans: 1, BannedSeconds: 6, RequestsDuringBans: 90, BanPeriods: []loadtest.BanPeriod{{Authority: 2, Start: 10, End: 16}},
				DeliveriesPerJob: 3.4, DeadLettered: 0, CPUSeconds: 5.5, PeakHeapBytes: 52 << 20, Series: series(28, 7, 15),
			},
			{Strategy: "cooldown", Mode: loadtest.ModeInProcess, Error: "start origin: listen tcp 127.0.0.1:0: <refused>"},
		},
	}
}

func TestReportHTMLGolden(t *testing.T) {
	var got bytes.Buffer
	if err := sampleReport().WriteHTML(&got); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "report.golden.html")
	if *update {
		if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./loadtest -run Golden -update to create it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("report.html differs from %s; if the change is intended, rerun with -update and review the diff", golden)
	}
}

func TestReportIsSelfContained(t *testing.T) {
	var page bytes.Buffer
	if err := sampleReport().WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	s := page.String()
	for _, banned := range []string{"<script", "http://", "https://", "<link", "@import", "url("} {
		// The SVG namespace is an identifier, never fetched.
		if strings.Contains(strings.ReplaceAll(s, `xmlns="http://www.w3.org/2000/svg"`, ""), banned) {
			t.Errorf("report.html contains %q: it must not fetch anything", banned)
		}
	}
	// Text from the report is escaped, not injected.
	if strings.Contains(s, "<shared>") || strings.Contains(s, "<refused>") {
		t.Error("report text was not HTML-escaped")
	}
}

func TestReportJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r := sampleReport()
	if err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back loadtest.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != 3 || back.Results[0].Status429 != 9 || len(back.Results[1].Series) != 28 || back.Setup.AllowedRate != 8 {
		t.Fatalf("report.json lost data: %+v", back.Results)
	}
	if _, err := os.Stat(filepath.Join(dir, "report.html")); err != nil {
		t.Fatal(err)
	}
}

func TestReportTable(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 9 { // 3 verdict lines, header, 3 rows, the pods line, the error line
		t.Fatalf("table has %d lines:\n%s", len(lines), b.String())
	}
	for _, want := range []string{"goodput", "hostpacer", "processes", "0.99", "error", "cooldown: start origin",
		"hostpacer: 2 pods, sharing the partitions 4.2 s after they started; requests sent: loadtest-hostpacer-pod1 110, loadtest-hostpacer-pod2 100",
		"Finished first without being rude: hostpacer, drained in 25.4 s (9 429s, 0 told to wait, 0 bans).",
		"fixed drained in 27.9 s (2.5 s later), rudely: 310 requests sent while told to wait; 1 ban, 6.0 s banned in all, 90 requests wasted during them.",
		"cooldown could not run."} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// chromiumPath is the headless browser the report must open in: $CHROMIUM,
// or the Debian package's /usr/bin/chromium.
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

// skippedFileEnv names a file to which a test skipped for a missing
// optional dependency appends a line; `make test` prints the lines at the
// end, so a skip is never silent there.
const skippedFileEnv = "MW_SKIPPED_FILE"

// needChromium skips t when Chromium is missing, except under CI=true where
// that is a failure, and leaves a line for `make test` to print.
func needChromium(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a browser")
	}
	chromium := chromiumPath()
	_, err := os.Stat(chromium)
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found (%v): CI must install it (apt-get install -y chromium; .ci/run does when run as root)", chromium, err)
	}
	msg := fmt.Sprintf("%s skipped: %s not found; install it (apt-get install -y chromium) and run: go test -run Chromium ./loadtest/", t.Name(), chromium)
	if f := os.Getenv(skippedFileEnv); f != "" {
		if fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(fh, "loadtest: "+msg)
			fh.Close()
		}
	}
	t.Skip(msg)
}

// chromiumDOM loads page in headless Chromium with a window width px wide
// and returns the DOM the browser built (--dump-dom), after any script in
// the page ran.
func chromiumDOM(t *testing.T, page string, width int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromiumPath(),
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--user-data-dir="+filepath.Join(t.TempDir(), "profile"),
		fmt.Sprintf("--window-size=%d,1000", width),
		"--dump-dom", "file://"+page)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("chromium did not finish within 90 s; stderr:\n%s", stderr.String())
		}
		t.Fatalf("chromium: %v; stderr:\n%s", err, stderr.String())
	}
	return stdout.String()
}

// TestReportOpensInChromium renders report.html in headless Chromium and
// checks that the browser built the summary table and a chart. CI installs
// Chromium (a Debian package); without it the test fails under CI=true and is
// skipped elsewhere, loudly in `make test`.
func TestReportOpensInChromium(t *testing.T) {
	needChromium(t)
	dir := t.TempDir()
	if err := sampleReport().WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	dom := chromiumDOM(t, filepath.Join(dir, "report.html"), 1280)
	// --dump-dom prints the DOM the browser built, not the file: these are
	// elements Chromium parsed, with the table rows and the SVG content.
	for _, want := range []string{
		`<table class="summary" id="summary">`,
		`<tr class="hostpacer winner"><td>hostpacer</td>`,
		`<div class="verdict" id="verdict"><p class="first">Finished first without being rude: hostpacer`,
		`<td class="rude">310</td>`,
		`<rect class="ban"`,
		`<svg class="chart cumulative"`,
		`<figure id="chart-hostpacer">`,
		`<svg class="chart"`,
		`<rect class="r429"`,
		`<line class="allowed"`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the DOM Chromium built lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("DOM (first 3000 bytes):\n%.3000s", dom)
	}
}

// layoutProbe measures the rendered page from inside the browser. It is
// added to a copy of report.html for this test only (the report itself has
// no script) and writes what it measured as JSON into the DOM, which
// --dump-dom returns.
const layoutProbe = `<script>
(function () {
  var vw = document.documentElement.clientWidth;
  var table = document.getElementById("summary");
  var scroll = table.parentElement;
  var ths = table.querySelectorAll("thead th");
  var last = ths[ths.length - 1].getBoundingClientRect();
  var overlaps = [];
  document.querySelectorAll("svg.chart").forEach(function (svg) {
    var label = svg.querySelector(".allowed-label");
    if (!label) { return; }
    var l = label.getBoundingClientRect();
    svg.querySelectorAll("rect").forEach(function (r) {
      var b = r.getBoundingClientRect();
      if (b.width > 0 && b.height > 0 && l.left < b.right && b.left < l.right && l.top < b.bottom && b.top < l.bottom) {
        overlaps.push(svg.parentElement.id);
      }
    });
  });
  var out = document.createElement("pre");
  out.id = "layout-probe";
  out.textContent = JSON.stringify({
    viewport: vw,
    pageScrollWidth: document.documentElement.scrollWidth,
    tableRight: table.getBoundingClientRect().right,
    scrollWidth: scroll.scrollWidth,
    scrollClientWidth: scroll.clientWidth,
    lastHeader: ths[ths.length - 1].textContent,
    lastHeaderRight: last.right,
    labelOverlaps: overlaps
  });
  document.body.appendChild(out);
})();
</script>`

// TestReportLayoutInChromium renders the report in Chromium at 1280 and
// 1920 px wide and checks, as measured by the browser, that the summary
// table fits without scrolling sideways (its last column, heap MiB,
// included) and that no chart's allowed-rate label lies over a bar.
func TestReportLayoutInChromium(t *testing.T) {
	needChromium(t)
	var page bytes.Buffer
	if err := sampleReport().WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	probed := strings.Replace(page.String(), "</body>", layoutProbe+"\n</body>", 1)
	file := filepath.Join(t.TempDir(), "report.html")
	if err := os.WriteFile(file, []byte(probed), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, width := range []int{1280, 1920} {
		t.Run(strconv.Itoa(width), func(t *testing.T) {
			dom := chromiumDOM(t, file, width)
			_, rest, ok := strings.Cut(dom, `<pre id="layout-probe">`)
			raw, _, ok2 := strings.Cut(rest, "</pre>")
			if !ok || !ok2 {
				t.Fatalf("the layout probe did not run; DOM (first 2000 bytes):\n%.2000s", dom)
			}
			var m struct {
				Viewport, PageScrollWidth, ScrollWidth, ScrollClientWidth float64
				TableRight, LastHeaderRight                               float64
				LastHeader                                                string
				LabelOverlaps                                             []string
			}
			if err := json.Unmarshal([]byte(html.UnescapeString(raw)), &m); err != nil {
				t.Fatalf("layout probe: %v: %s", err, raw)
			}
			t.Logf("%+v", m)
			if m.Viewport < float64(width)-20 || m.Viewport > float64(width) {
				t.Fatalf("viewport %v px wide, want about %d: the window size was not applied", m.Viewport, width)
			}
			if m.ScrollWidth > m.ScrollClientWidth || m.TableRight > m.Viewport || m.PageScrollWidth > m.Viewport {
				t.Errorf("the summary table does not fit %d px: table right edge %v, its box scrolls %v in %v, page %v wide in a %v px viewport",
					width, m.TableRight, m.ScrollWidth, m.ScrollClientWidth, m.PageScrollWidth, m.Viewport)
			}
			if m.LastHeader != "heap MiB" || m.LastHeaderRight > m.Viewport {
				t.Errorf("last column %q ends at %v px, past the %v px viewport", m.LastHeader, m.LastHeaderRight, m.Viewport)
			}
			if len(m.LabelOverlaps) > 0 {
				t.Errorf("the allowed-rate label overlaps bars in %v", m.LabelOverlaps)
			}
		})
	}
}
