package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what one load test measured: the setup and, per strategy, what
// the workers did and what the origin saw. It is written as report.json
// (this struct) and report.html (a rendering of it).
type Report struct {
	Title       string    `json:"title"`
	GeneratedAt time.Time `json:"generated_at"`
	Command     string    `json:"command"`
	Setup       Setup     `json:"setup"`
	// Notes say how the numbers were measured and where they are weaker
	// than they look (shared-process CPU, shared caller identity).
	Notes   []string `json:"notes"`
	Results []Result `json:"results"`
}

// Setup is the load test's configuration, the same for every strategy.
type Setup struct {
	Jobs        int     `json:"jobs"`
	Authorities int     `json:"authorities"`
	Workers     int     `json:"workers"`
	Skew        float64 `json:"skew"` // share of the jobs on the hottest authority
	Profile     string  `json:"profile"`
	ProfileFile string  `json:"profile_file,omitempty"`
	Scale       float64 `json:"scale"` // strategies' time constants are multiplied by this
	// FloorSeconds and MaxInFlight are the politeness policy every strategy keeps.
	FloorSeconds float64 `json:"floor_seconds"`
	MaxInFlight  int     `json:"max_in_flight"`
	// FloorNote, when set, replaces the floor in the page's setup: a
	// report that merges runs at different floors says so there.
	FloorNote string `json:"floor_note,omitempty"`
	// Identities is how many caller identities the origin tells apart per
	// authority (one per worker instance when each has its own address).
	Identities int `json:"identities_per_authority"`
	// AllowedRate is what the profile allows, in admitted requests per
	// second: the sustained quota summed over authorities and identities.
	AllowedRate float64 `json:"allowed_rate"`
	// Allowance[t] is the most the origin admits by t seconds into a run,
	// all authorities together, from full buckets (Profile.AllowedAdmissions):
	// a bound no strategy can pass, up to the longest run.
	Allowance []float64 `json:"allowance,omitempty"`
	// Penalty says what the origin does to a caller that keeps coming
	// early ("off" when nothing).
	Penalty          string  `json:"penalty,omitempty"`
	TimeLimitSeconds float64 `json:"time_limit_seconds"`
	ObjectSize       int64   `json:"object_size"`
	GoVersion        string  `json:"go_version"`
	Platform         string  `json:"platform"`
	CPUs             int     `json:"cpus"`
}

// Modes of Result.Mode.
const (
	ModeInProcess = "in-process" // workers in the load-test process
	ModeProcesses = "processes"  // `mirrorworker run` pods
)

// Result is one strategy's run.
type Result struct {
	Strategy string `json:"strategy"`
	// Mode is how the workers ran: ModeInProcess or ModeProcesses.
	Mode string `json:"mode"`
	// Drained: every job left the queue (stored or dead-lettered) before the
	// time limit.
	Drained      bool    `json:"drained"`
	DrainSeconds float64 `json:"drain_seconds"` // until drained, or the time limit
	JobsStored   int     `json:"jobs_stored"`
	JobsPerSec   float64 `json:"jobs_per_second"`
	// Admitted is what the origin admitted during the run, AdmittedPerSec
	// the same per second of drain time; Goodput is Admitted as a fraction of
	// what the profile allows in the drain time (burst credit included, see
	// Profile.AllowedAdmissions).
	Admitted       int64   `json:"admitted"`
	AdmittedPerSec float64 `json:"admitted_per_second"`
	Goodput        float64 `json:"goodput"`
	// The origin's counts (its own /stats), summed over authorities.
	Requests  int64 `json:"requests"`
	Status429 int64 `json:"status_429"`
	Status503 int64 `json:"status_503"`
	Status403 int64 `json:"status_403,omitempty"` // bans answered 403
	// Penalties the origin gave (its profile's penalty), summed over
	// authorities and identities: Bans started, BannedSeconds spent banned,
	// RequestsDuringBans answered with a ban (wasted), Tarpitted answers
	// held and TarpitSeconds they were held.
	Bans               int64   `json:"bans"`
	BannedSeconds      float64 `json:"banned_seconds"`
	RequestsDuringBans int64   `json:"requests_during_bans"`
	Tarpitted          int64   `json:"tarpitted,omitempty"`
	TarpitSeconds      float64 `json:"tarpit_seconds,omitempty"`
	// BanPeriods are the bans, in seconds since the strategy's run started,
	// with the authority's index.
	BanPeriods []BanPeriod `json:"ban_periods,omitempty"`
	// Early is the origin's count (its /stats): requests that arrived
	// before a deadline their identity had been told, whether or not they
	// were sent before the answer that told it (refusals.go). EarlyTold
	// were sent after the origin had written that answer, or may have been
	// (the rude kind); EarlyCrossed were on their way before it was written.
	// Without departure logs (DeparturesLogged false) every one is told.
	// EarlyRequests lists them.
	Early            int64          `json:"early"`
	EarlyTold        int64          `json:"early_told"`
	EarlyCrossed     int64          `json:"early_crossed"`
	DeparturesLogged bool           `json:"departures_logged"`
	EarlyRequests    []EarlyRequest `json:"early_requests,omitempty"`
	// GapsBelowFloor: arrivals from one identity closer than the floor to the
	// previous one from that identity. AuthorityGapsBelowFloor counts the
	// same over all identities of an authority together.
	GapsBelowFloor          int64   `json:"gaps_below_floor"`
	AuthorityGapsBelowFloor int64   `json:"authority_gaps_below_floor"`
	MinGapSeconds           float64 `json:"min_gap_seconds"`
	// SentGapsBelowFloor counts the same gaps as the workers timed their
	// departures (per authority); MinSentGapSeconds is the closest pair.
	SentGapsBelowFloor int64   `json:"sent_gaps_below_floor"`
	MinSentGapSeconds  float64 `json:"min_sent_gap_seconds"`
	// Rejections counts the origin's refusals by reason (burst, sustained,
	// tenant_share, shared_capacity...).
	Rejections map[string]int64 `json:"rejections,omitempty"`
	// DeliveriesPerJob is JetStream deliveries over jobs enqueued (1 is
	// ideal; deferrals and retries add to it).
	DeliveriesPerJob float64 `json:"deliveries_per_job"`
	DeadLettered     int     `json:"dead_lettered"`
	// CPUSeconds and PeakHeapBytes are the whole load-test process during
	// this strategy's run (workers, origin and JetStream share it).
	CPUSeconds    float64 `json:"cpu_seconds"`
	PeakHeapBytes uint64  `json:"peak_heap_bytes"`
	// StartupSeconds (pods only) is from starting the pods to every pod
	// holding its share of the partitions, before the run is measured.
	StartupSeconds float64 `json:"startup_seconds,omitempty"`
	// Pods is what each pod did (pods only).
	Pods []PodResult `json:"pods,omitempty"`
	// Series is the origin's timeline, one point per second, summed over
	// authorities.
	Series []Point `json:"series"`
	// Error is set when the run could not complete (setup failure).
	Error string `json:"error,omitempty"`
}

// PodResult is one `mirrorworker run` process of a pods run.
type PodResult struct {
	ID string `json:"id"`
	// Requests it sent (its departure log).
	Requests int64 `json:"requests"`
	// CPUSeconds (user and system) and MaxRSSBytes (peak resident set) over
	// its whole life, from its exit status.
	CPUSeconds  float64 `json:"cpu_seconds"`
	MaxRSSBytes uint64  `json:"max_rss_bytes"`
	ExitCode    int     `json:"exit_code"`
}

// Point is one second of the origin's timeline.
type Point struct {
	T         int   `json:"t"` // seconds since the strategy's run started
	Requests  int64 `json:"requests"`
	Admitted  int64 `json:"admitted"`
	Status429 int64 `json:"status_429"`
	Status503 int64 `json:"status_503"`
	Status403 int64 `json:"status_403,omitempty"`
	// Banned is how many authorities' callers were banned in this second,
	// on average over it (0.5: one of them for half the second).
	Banned float64 `json:"banned,omitempty"`
}

// BanPeriod is one ban at the origin, in seconds since the run started.
type BanPeriod struct {
	Authority int     `json:"authority"`
	Start     float64 `json:"start"`
	End       float64 `json:"end"`
}

// WriteFiles writes dir/report.json and dir/report.html, creating dir.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report dir: %w", err)
	}
	var js, page bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		return err
	}
	if err := r.WriteHTML(&page); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), js.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.html"), page.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report.html: %w", err)
	}
	return nil
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	return nil
}

// tableHeader names the summary columns, shared by the text table and the
// HTML table so the two never disagree.
var tableHeader = []string{
	"strategy", "mode", "drained", "drain s", "jobs/s", "goodput", "429s", "503s", "told to wait", "crossed",
	"bans", "banned s", "in bans", "gaps<floor", "sent<floor", "deliv/job", "dead", "cpu s", "heap MiB",
}

// Told is how many of the origin's early requests were sent while their
// caller had been told to wait, or may have been: all but those the
// departures prove crossed the refusal (EarlyCrossed).
func (r Result) Told() int64 { return r.Early - r.EarlyCrossed }

// Rude reports whether the strategy was rude to the origin by the origin's
// own account: it sent requests while told to wait (Told: a request that
// was on its way before the origin wrote its refusal is not), or earned a
// ban. 429s
// alone are not rude (a strategy that learns only from 429s, without
// rate-limit headers, needs some), and neither are gaps below the floor,
// which timing noise on a loaded machine also makes (the table marks them).
func (r Result) Rude() bool {
	return r.Told() > 0 || r.Bans > 0 || r.RequestsDuringBans > 0
}

// cell is one summary cell; Class marks a rude number ("rude") or a
// refused one ("warn") in the HTML table.
type cell struct{ Text, Class string }

func count(v int64, class string) cell {
	if v == 0 {
		return cell{Text: "0"}
	}
	return cell{Text: itoa(v), Class: class}
}

func (r Result) cells() []cell {
	drained := "yes"
	if !r.Drained {
		drained = "no"
	}
	if r.Error != "" {
		drained = "error"
	}
	banned := cell{Text: f1(r.BannedSeconds)}
	if r.BannedSeconds > 0 {
		banned.Class = "rude"
	}
	return []cell{
		{Text: r.Strategy}, {Text: r.Mode}, {Text: drained}, {Text: f1(r.DrainSeconds)}, {Text: f1(r.JobsPerSec)}, {Text: f2(r.Goodput)},
		count(r.Status429, "warn"), count(r.Status503, "warn"), count(r.Told(), "rude"), {Text: itoa(r.EarlyCrossed)},
		count(r.Bans, "rude"), banned, count(r.RequestsDuringBans, "rude"),
		{Text: itoa(r.GapsBelowFloor)}, count(r.SentGapsBelowFloor, "warn"),
		{Text: f2(r.DeliveriesPerJob)}, {Text: strconv.Itoa(r.DeadLettered)}, {Text: f1(r.CPUSeconds)},
		{Text: f1(float64(r.PeakHeapBytes) / (1 << 20))},
	}
}

// Verdict names the strategy that drained first without being rude, and
// says what the others cost: one line each, the winner's first. It is the
// report's first statement, in the text output and the HTML page.
func (r *Report) Verdict() []string {
	var winner *Result
	if i := r.winner(); i >= 0 {
		winner = &r.Results[i]
	}
	var out []string
	if winner != nil {
		crossed := ""
		if winner.EarlyCrossed > 0 {
			crossed = fmt.Sprintf(", %s crossed a refusal in flight", itoa(winner.EarlyCrossed))
		}
		out = append(out, fmt.Sprintf("Finished first without being rude: %s, drained in %s s (%s 429s, 0 told to wait%s, 0 bans).",
			winner.Strategy, f1(winner.DrainSeconds), itoa(winner.Status429), crossed))
	} else {
		out = append(out, "No strategy drained without being rude.")
	}
	for _, res := range r.Results {
		if winner != nil && res.Strategy == winner.Strategy {
			continue
		}
		switch {
		case res.Error != "":
			out = append(out, fmt.Sprintf("%s could not run.", res.Strategy))
			continue
		case !res.Drained:
			out = append(out, fmt.Sprintf("%s did not drain within the %s s limit", res.Strategy, f1(r.Setup.TimeLimitSeconds)))
		case winner != nil:
			d := res.DrainSeconds - winner.DrainSeconds
			rel := fmt.Sprintf("%s s later", f1(d))
			if d < 0 {
				rel = fmt.Sprintf("%s s sooner", f1(-d))
			}
			out = append(out, fmt.Sprintf("%s drained in %s s (%s)", res.Strategy, f1(res.DrainSeconds), rel))
		default:
			out = append(out, fmt.Sprintf("%s drained in %s s", res.Strategy, f1(res.DrainSeconds)))
		}
		last := &out[len(out)-1]
		if !res.Rude() {
			*last += ", politely."
			continue
		}
		var costs []string
		if t := res.Told(); t > 0 {
			costs = append(costs, itoa(t)+" "+plural64(t, "request", "requests")+" sent while told to wait")
		}
		if res.Bans > 0 {
			costs = append(costs, fmt.Sprintf("%s %s, %s s banned in all, %s requests wasted during them",
				itoa(res.Bans), plural64(res.Bans, "ban", "bans"), f1(res.BannedSeconds), itoa(res.RequestsDuringBans)))
		}
		*last += ", rudely: " + strings.Join(costs, "; ") + "."
	}
	return out
}

// winner is the index of the strategy that drained first without being
// rude, -1 when none did.
func (r *Report) winner() int {
	w := -1
	for i, res := range r.Results {
		if res.Error == "" && res.Drained && !res.Rude() && (w < 0 || res.DrainSeconds < r.Results[w].DrainSeconds) {
			w = i
		}
	}
	return w
}

// WriteTable writes the verdict and the summary as an aligned text table.
func (r *Report) WriteTable(w io.Writer) error {
	for _, l := range r.Verdict() {
		fmt.Fprintln(w, l)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(tableHeader, "\t")+"\t")
	for _, res := range r.Results {
		var texts []string
		for _, c := range res.cells() {
			texts = append(texts, c.Text)
		}
		fmt.Fprintln(tw, strings.Join(texts, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	for _, res := range r.Results {
		if res.Error != "" {
			fmt.Fprintf(w, "%s: %s\n", res.Strategy, res.Error)
		}
		if res.Early > 0 && !res.DeparturesLogged {
			fmt.Fprintf(w, "%s: no departures logged, so its %d early requests all count as told to wait (the origin's count)\n", res.Strategy, res.Early)
		}
		if len(res.Pods) > 0 {
			var each []string
			for _, p := range res.Pods {
				each = append(each, fmt.Sprintf("%s %d", p.ID, p.Requests))
			}
			fmt.Fprintf(w, "%s: %d pods, sharing the partitions %.1f s after they started; requests sent: %s\n",
				res.Strategy, len(res.Pods), res.StartupSeconds, strings.Join(each, ", "))
		}
	}
	return nil
}

func f1(v float64) string   { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string   { return strconv.FormatFloat(v, 'f', 2, 64) }
func itoa(v int64) string   { return strconv.FormatInt(v, 10) }
func fmtG(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
