package loadtest_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/loadtest"
)

// quickProfile throttles hard enough that a strategy ignoring the origin is
// refused within a second, and small enough that a run takes a few seconds.
// It sends IETF RateLimit headers, so a strategy that reads them can avoid
// every 429 (a 429 would cost the HostPacer its unscaled 2 s step).
const quickProfile = `{
  "name": "quick",
  "scale": 0.01,
  "floor": "50ms",
  "max_in_flight": 2,
  "object_size": 512,
  "origin": {
    "name": "quick-origin",
    "quotas": {"anonymous": {
      "burst": {"capacity": 3, "refill_per_second": 10},
      "sustained": {"capacity": 6, "window": "1s"}}},
    "rate_limit_headers": "ietf"
  }
}`

func TestRunComparesStrategies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a load test")
	}
	p, err := loadtest.ParseProfile([]byte(quickProfile))
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	traceDir := t.TempDir()
	rep, err := loadtest.Run(ctx, loadtest.Options{
		Jobs: 60, Authorities: 3, Workers: 2, Profile: p, InProcess: true,
		Strategies: []string{"hostpacer", "fixed"},
		TimeLimit:  60 * time.Second, Dir: t.TempDir(), TraceDir: traceDir,
		Progress: &progress, ProgressEvery: time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Setup.AllowedRate != 18 { // 6/s x 3 authorities
		t.Errorf("allowed rate %v, want 18", rep.Setup.AllowedRate)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want 2", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Error != "" || !r.Drained || r.JobsStored != 60 || r.DeadLettered != 0 {
			t.Errorf("%s: error=%q drained=%v stored=%d dead=%d; want all 60 stored", r.Strategy, r.Error, r.Drained, r.JobsStored, r.DeadLettered)
		}
		var admitted, throttled int64
		for _, pt := range r.Series {
			admitted += pt.Admitted
			throttled += pt.Status429
		}
		// The trace has one line per request the origin counted.
		if b, err := os.ReadFile(filepath.Join(traceDir, r.Strategy, "arrivals.log")); err != nil {
			t.Errorf("%s: trace: %v", r.Strategy, err)
		} else if n := int64(bytes.Count(b, []byte("\n"))); n != r.Requests {
			t.Errorf("%s: %d arrivals traced, the origin counted %d requests", r.Strategy, n, r.Requests)
		}
		// Every stored job was one admitted request the timeline saw.
		if admitted < 60 || r.Requests < 60 {
			t.Errorf("%s: timeline admitted %d, origin requests %d; want at least 60", r.Strategy, admitted, r.Requests)
		}
		if throttled > r.Status429 {
			t.Errorf("%s: timeline has %d 429s, origin total %d", r.Strategy, throttled, r.Status429)
		}
		if r.DeliveriesPerJob < 1 {
			t.Errorf("%s: %v deliveries per job", r.Strategy, r.DeliveriesPerJob)
		}
	}
	host, fixed := rep.Results[0], rep.Results[1]
	if host.Mode != loadtest.ModeInProcess || fixed.Mode != loadtest.ModeInProcess || host.Pods != nil {
		t.Errorf("modes %q and %q (pods %v), want both in-process", host.Mode, fixed.Mode, host.Pods)
	}
	// A 50 ms floor is 20/s per authority against 6/s allowed: the fixed
	// pacer must be refused, and the HostPacer must never go early.
	if fixed.Status429 == 0 {
		t.Error("fixed was never refused: the profile does not throttle")
	}
	if host.Early != 0 {
		t.Errorf("hostpacer sent %d requests while told to wait", host.Early)
	}
	if !strings.Contains(progress.String(), "[1/2 hostpacer] drained") {
		t.Errorf("progress lacks the drained line:\n%s", progress.String())
	}
}

// At real time the HostPacer runs at scale 1, and what spending the
// announced budget buys is visible: no 429, so none of the 2 s steps a
// compressed run would shrink.
func TestRunAtRealTime(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a load test")
	}
	p, err := loadtest.ParseProfile([]byte(quickProfile))
	if err != nil {
		t.Fatal(err)
	}
	rt := p.RealTime()
	if rt.Scale != 1 || p.Scale != 0.01 || rt.Origin != p.Origin || rt.Floor != p.Floor {
		t.Fatalf("RealTime: scale %v (original %v), same origin %v; want 1, 0.01, true", rt.Scale, p.Scale, rt.Origin == p.Origin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := loadtest.Run(ctx, loadtest.Options{
		Jobs: 30, Authorities: 1, Workers: 1, Profile: rt, InProcess: true,
		Strategies: []string{"hostpacer"},
		TimeLimit:  60 * time.Second, Dir: t.TempDir(),
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Setup.Scale != 1 {
		t.Errorf("report scale %v, want 1", rep.Setup.Scale)
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "Real time (scale 1)") {
		t.Errorf("notes do not say the run is at real time:\n%s", strings.Join(rep.Notes, "\n"))
	}
	r := rep.Results[0]
	if r.Error != "" || !r.Drained || r.JobsStored != 30 {
		t.Fatalf("error=%q drained=%v stored=%d; want all 30 stored", r.Error, r.Drained, r.JobsStored)
	}
	if r.Status429 != 0 || r.Early != 0 {
		t.Errorf("%d throttled, %d early at real time; want none", r.Status429, r.Early)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	p, err := loadtest.ParseProfile([]byte(quickProfile))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []loadtest.Options{
		{Jobs: 0, Authorities: 1, Workers: 1, Profile: p, Strategies: []string{"fixed"}},
		{Jobs: 1, Authorities: 4, Workers: 1, Profile: p, Strategies: []string{"fixed"}, Skew: 0.1},
		{Jobs: 1, Authorities: 1, Workers: 1, Strategies: []string{"fixed"}},
		{Jobs: 1, Authorities: 1, Workers: 1, Profile: p},
		// The hostpacer runs as pods unless in-process: it needs their binary.
		{Jobs: 1, Authorities: 1, Workers: 1, Profile: p, Strategies: []string{"hostpacer"}},
	} {
		if _, err := loadtest.Run(context.Background(), o); err == nil {
			t.Errorf("Run(%+v) accepted bad options", o)
		}
	}
}

func TestParseProfile(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		wantErr    bool
		floor      time.Duration
		scale      float64
	}{
		{name: "plain stub profile", json: `{"name":"s","quotas":{"anonymous":{"burst":{"capacity":1,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}}}`, floor: time.Second, scale: 1},
		{name: "wrapper", json: quickProfile, floor: 50 * time.Millisecond, scale: 0.01},
		{name: "unknown field", json: `{"origin":{}, "scael": 1}`, wantErr: true},
		{name: "scale above 1", json: strings.Replace(quickProfile, `"scale": 0.01`, `"scale": 3`, 1), wantErr: true},
		{name: "no anonymous quota", json: `{"scale":1,"origin":{"quotas":{"default":{"burst":{"capacity":1,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}}}}`, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := loadtest.ParseProfile([]byte(tc.json))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err == nil && (p.Floor != tc.floor || p.Scale != tc.scale) {
				t.Fatalf("floor %v scale %v, want %v %v", p.Floor, p.Scale, tc.floor, tc.scale)
			}
		})
	}
}

func TestProfilesInTestdataParse(t *testing.T) {
	for _, f := range []string{"loadtest-throttling.json", "loadtest-retry-after.json", "nginx-limit-req.json", "nginx-limit-req-503.json", "haproxy-stick-table.json"} {
		if _, err := loadtest.LoadProfile("../testdata/profiles/" + f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestDefaultProfileIsTheFile: the profile built into the binary is the
// repository's file, byte for byte, so the two cannot drift.
func TestDefaultProfileIsTheFile(t *testing.T) {
	file, err := os.ReadFile(filepath.Join("..", loadtest.DefaultProfileFile))
	if err != nil {
		t.Fatal(err)
	}
	built, err := os.ReadFile("default-profile.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file, built) {
		t.Fatalf("loadtest/default-profile.json differs from %s: copy it again", loadtest.DefaultProfileFile)
	}
	def, err := loadtest.LoadProfile("")
	if err != nil {
		t.Fatal(err)
	}
	p, err := loadtest.LoadProfile(filepath.Join("..", loadtest.DefaultProfileFile))
	if err != nil {
		t.Fatal(err)
	}
	if def.Name != p.Name || def.Floor != p.Floor || def.Scale != p.Scale {
		t.Errorf("the built-in profile %+v, the file's %+v", def, p)
	}
}

func TestAllowedAdmissions(t *testing.T) {
	p, err := loadtest.LoadProfile("../testdata/profiles/loadtest-throttling.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d    time.Duration
		want float64
	}{
		// 20 in the bucket + 2/s, per authority; the 75% share of 40 per
		// 10 s window binds first in the first window, the burst bucket (5
		// + 4/s) before 7.5 s.
		{d: 41 * time.Second, want: 50 * 102},
		{d: 5 * time.Second, want: 50 * 25},
		{d: 10 * time.Second, want: 50 * 30},
		{d: 0, want: 0},
	} {
		if got := p.AllowedAdmissions(50, 1, tc.d); got != tc.want {
			t.Errorf("AllowedAdmissions(50, 1, %v) = %v, want %v", tc.d, got, tc.want)
		}
	}
	if got := p.AllowedRate(50, 1); got != 100 {
		t.Errorf("AllowedRate = %v, want 100", got)
	}
}

// penaltyProfile is quickProfile with a penalty: 10 requests sent while
// told to wait, within 2 s, ban the caller for 5 s (429, Retry-After the
// time left).
const penaltyProfile = `{
  "name": "quick-penalty",
  "scale": 0.01,
  "floor": "50ms",
  "max_in_flight": 2,
  "object_size": 512,
  "origin": {
    "name": "quick-penalty-origin",
    "quotas": {"anonymous": {
      "burst": {"capacity": 3, "refill_per_second": 10},
      "sustained": {"capacity": 6, "window": "1s"}}},
    "rate_limit_headers": "ietf",
    "penalty": {"after": 10, "within": "2s", "for": "5s", "ban": {"status": 429, "disclosed": true}}
  }
}`

// With the origin's penalty on, the fixed strategy (the floor and nothing
// else: it never reads a 429) earns bans and drains later than the
// HostPacer, which is never banned, in every run.
func TestPenaltiesBanTheRudeAndSlowThemDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a load test")
	}
	p, err := loadtest.ParseProfile([]byte(penaltyProfile))
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		rep, err := loadtest.Run(ctx, loadtest.Options{
			Jobs: 60, Authorities: 3, Workers: 2, Profile: p, InProcess: true,
			Strategies: []string{"hostpacer", "fixed"},
			TimeLimit:  60 * time.Second, Dir: t.TempDir(),
			Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		host, fixed := rep.Results[0], rep.Results[1]
		for _, r := range rep.Results {
			if r.Error != "" || !r.Drained || r.JobsStored != 60 {
				t.Fatalf("round %d, %s: error=%q drained=%v stored=%d; want all 60 stored", round, r.Strategy, r.Error, r.Drained, r.JobsStored)
			}
		}
		if host.Bans != 0 || host.RequestsDuringBans != 0 || host.Early != 0 || len(host.BanPeriods) != 0 {
			t.Errorf("round %d: hostpacer banned %d times (%d requests during bans, %d early); want never", round, host.Bans, host.RequestsDuringBans, host.Early)
		}
		if fixed.Bans < 1 || fixed.RequestsDuringBans < 1 || fixed.BannedSeconds <= 0 || len(fixed.BanPeriods) != int(fixed.Bans) {
			t.Errorf("round %d: fixed %d bans, %d requests during them, %.1f s banned, %d periods; want at least one ban", round, fixed.Bans, fixed.RequestsDuringBans, fixed.BannedSeconds, len(fixed.BanPeriods))
		}
		var shaded float64
		for _, pt := range fixed.Series {
			shaded += pt.Banned
		}
		if fixed.Bans > 0 && shaded <= 0 {
			t.Errorf("round %d: fixed was banned but no second of its series is marked", round)
		}
		if fixed.DrainSeconds <= host.DrainSeconds {
			t.Errorf("round %d: fixed drained in %.1f s, hostpacer in %.1f s; want the banned strategy later", round, fixed.DrainSeconds, host.DrainSeconds)
		}
		if v := rep.Verdict(); !strings.HasPrefix(v[0], "Finished first without being rude: hostpacer") {
			t.Errorf("round %d: verdict %q, want the hostpacer named", round, v)
		}
		t.Logf("round %d: hostpacer %.1f s, 0 bans; fixed %.1f s, %d bans, %.1f s banned, %d requests during bans",
			round, host.DrainSeconds, fixed.DrainSeconds, fixed.Bans, fixed.BannedSeconds, fixed.RequestsDuringBans)
	}
}
