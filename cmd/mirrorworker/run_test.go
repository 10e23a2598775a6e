package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
)

func noEnv(string) string { return "" }

// runInProcess starts `mirrorworker run args...` in this process and returns
// its start line, its log and a channel with run's result.
func runInProcess(t *testing.T, ctx context.Context, args ...string) (startInfo, *logWatch, <-chan error) {
	t.Helper()
	log := newLogWatch()
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		err := run(ctx, append([]string{"run"}, args...), noEnv, strings.NewReader(""), io.Discard, log)
		done <- err
		close(exited)
	}()
	return log.waitStart(t, exited), log, done
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestRunInProcess runs the worker with its embedded JetStream on ephemeral
// ports, feeds it jobs for a loopback origin, checks the admin endpoint and
// stops it by cancelling the context.
func TestRunInProcess(t *testing.T) {
	const n = 12
	origin := newObjectOrigin(t)
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	si, log, done := runInProcess(t, ctx,
		"--data-dir", dataDir,
		"--embedded-listen", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0",
		"--allow-private-networks",
		"--floor", "0",
		"--max-in-flight", "4",
		"--concurrency", "4",
		"--worker-id", "test-worker",
	)
	if !strings.HasPrefix(si.NATSURL, "nats://127.0.0.1:") || !strings.HasPrefix(si.AdminURL, "http://127.0.0.1:") {
		t.Fatalf("start line lacks the addresses: %+v", si)
	}
	if want := filepath.Join(dataDir, "mirror"); si.Mirror != want {
		t.Errorf("mirror root %q, want %q", si.Mirror, want)
	}
	// --target-sync auto says what it found: a directory of a test's
	// temporary directory is never a file system of its own.
	if log.logLine(syncEachMsg, map[string]string{"target": si.Mirror, "found": " is a directory of the file system mounted at "}) == nil {
		t.Errorf("no line says the target fsyncs each object, and why; log:\n%s", log)
	}
	// Whether the metadata attribute takes a block of its own is said
	// where it does (mirror's TestMetadataTakesABlockAsObjectsDo checks
	// the finding against a real object's blocks).
	ft, err := mirror.Open(si.Mirror)
	if err != nil {
		t.Fatal(err)
	}
	if said := len(log.messages(attrBlockMsg)) > 0; said != ft.MetadataTakesABlock() {
		t.Errorf("the attribute's block said %v, found %v; log:\n%s", said, ft.MetadataTakesABlock(), log)
	}

	// Jobs arrive the way a newcomer sends them: the enqueue subcommand
	// against the embedded server's address from the start line.
	out := enqueueObjects(t, ctx, si.NATSURL, origin.URL, n)
	if !strings.Contains(out, strconv.Itoa(n)) {
		t.Errorf("enqueue output %q does not report %d jobs", out, n)
	}
	waitDrained(t, si.NATSURL, si.Mirror, n, 30*time.Second, log)

	if code, body := httpGet(t, si.AdminURL+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d %q", code, body)
	}
	waitFor(t, 10*time.Second, "/readyz 200", func() bool {
		code, _ := httpGet(t, si.AdminURL+"/readyz")
		return code == 200
	})
	_, metrics := httpGet(t, si.AdminURL+"/metrics")
	for _, name := range []string{
		"mirrorworker_jobs_total",
		"mirrorworker_upstream_requests_total",
		"mirrorworker_job_duration_seconds",
		"mirrorworker_fetched_bytes_total",
		"mirrorworker_pacer_authorities",
		"mirrorworker_inflight",
		"mirrorworker_build_info",
		"mirrorworker_dead_letters_total",
		"mirrorworker_consumer_pending",
		"mirrorworker_consumer_ack_pending",
		"mirrorworker_pacer_longest_cooling_seconds",
	} {
		if !strings.Contains(metrics, "\n"+name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	for _, line := range []string{
		"mirrorworker_nats_connected 1",
		"mirrorworker_ready 1",
		"mirrorworker_partitions_owned 32",
		`mirrorworker_consumer_pending{consumer="mirrorworker-p00",stream="MIRROR_JOBS"} 0`,
		`mirrorworker_dead_letters_total{reason="budget_exhausted"} 0`,
	} {
		if !strings.Contains(metrics, "\n"+line+"\n") {
			t.Errorf("/metrics lacks %q:\n%s", line, grepLines(metrics, strings.Fields(strings.SplitN(line, "{", 2)[0])[0]))
		}
	}
	if !strings.Contains(metrics, `mirrorworker_jobs_total{outcome="stored"} 12`) {
		t.Errorf("/metrics does not count %d stored jobs:\n%s", n, grepLines(metrics, "mirrorworker_jobs_total"))
	}

	code, body := httpGet(t, si.AdminURL+"/debug/pacer")
	var states []map[string]any
	if err := json.Unmarshal([]byte(body), &states); code != 200 || err != nil {
		t.Fatalf("/debug/pacer = %d %v:\n%s", code, err, body)
	}
	originAuth := strings.TrimPrefix(origin.URL, "http://")
	var found bool
	for _, s := range states {
		if s["authority"] == originAuth {
			found = true
			for _, k := range []string{"floor", "interval", "probing", "in_flight"} {
				if _, ok := s[k]; !ok {
					t.Errorf("/debug/pacer entry lacks %q: %v", k, s)
				}
			}
		}
	}
	if !found {
		t.Errorf("/debug/pacer does not track %s:\n%s", originAuth, body)
	}

	stopInProcess(t, cancel, done, log)
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(si.AdminURL, "http://"), time.Second); err == nil {
		c.Close()
		t.Errorf("admin endpoint still listening after run returned")
	}
	checkMeta(t, si.Mirror, origin, n)
}

// enqueueObjects enqueues jobs for the objects 0..n-1 of the origin at
// originURL, the way a newcomer sends them (the enqueue subcommand), and
// returns what enqueue printed.
func enqueueObjects(t *testing.T, ctx context.Context, natsURL, originURL string, n int) string {
	t.Helper()
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, `{"url":%q,"target":%q}`+"\n", fmt.Sprintf("%s/obj/%d", originURL, i), objectKey(i))
	}
	var out, errOut strings.Builder
	if err := run(ctx, []string{"enqueue", "--nats-url", natsURL}, noEnv, strings.NewReader(lines.String()), &out, &errOut); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errOut.String())
	}
	return out.String()
}

// stopInProcess cancels a runInProcess worker and waits for run to return
// nil.
func stopInProcess(t *testing.T, cancel context.CancelFunc, done <-chan error, log *logWatch) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after cancel = %v, want nil; log:\n%s", err, log)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("run did not return after cancel; log:\n%s", log)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestRunRejectsBadInput: mistakes are caught before anything starts, with
// a message naming the flag, and usage mistakes exit 2.
func TestRunRejectsBadInput(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	aFile := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(aFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	brokenCreds := filepath.Join(t.TempDir(), "credentials.json")
	if err := os.WriteFile(brokenCreds, []byte(`{"authorities": {"a.example:443": {"bearer": "hunter2"`), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int // 2: usage error; 1: other
		wantMsg  string
	}{
		{name: "proxy with a password", args: []string{"--proxy", "http://u:hunter2@proxy.internal:3128"}, wantCode: 2, wantMsg: "--proxy-credentials"},
		{name: "proxy scheme", args: []string{"--proxy", "ftp://proxy.internal:21"}, wantCode: 2, wantMsg: "want an http or https proxy"},
		{name: "proxy credentials without a proxy", args: []string{"--proxy-credentials", brokenCreds}, wantCode: 2, wantMsg: "no proxy"},
		{name: "proxy credentials malformed", args: []string{"--proxy", "http://proxy.internal:3128", "--proxy-credentials", aFile}, wantCode: 2, wantMsg: "want one line user:password"},
		{name: "missing credentials", args: []string{"--credentials", filepath.Join(t.TempDir(), "none")}, wantCode: 2, wantMsg: "--credentials"},
		{name: "credentials do not parse", args: []string{"--credentials", brokenCreds}, wantCode: 1, wantMsg: "credentials.json: invalid JSON"},
		{name: "auth holds", args: []string{"--auth-holds", "0"}, wantCode: 2, wantMsg: "--auth-holds"},
		{name: "unknown flag", args: []string{"--bogus"}, wantCode: 2, wantMsg: "bogus"},
		{name: "stray argument", args: []string{"extra"}, wantCode: 2, wantMsg: "unexpected arguments"},
		{name: "concurrency zero", args: []string{"--concurrency", "0"}, wantCode: 2, wantMsg: "--concurrency"},
		{name: "no idle connections", args: []string{"--max-idle-conns", "0"}, wantCode: 2, wantMsg: "--max-idle-conns"},
		{name: "replicas on the embedded server", args: []string{"--stream-replicas", "3"}, wantCode: 2, wantMsg: "needs a NATS cluster"},
		{name: "replicas from the environment", env: map[string]string{"MIRRORWORKER_STREAM_REPLICAS": "3"}, wantCode: 2, wantMsg: "--stream-replicas"},
		{name: "too many replicas", args: []string{"--nats-url", "nats://127.0.0.1:1", "--stream-replicas", "6"}, wantCode: 2, wantMsg: "want 1 to 5"},
		{name: "negative floor", args: []string{"--floor", "-1s"}, wantCode: 2, wantMsg: "--floor"},
		{name: "log format", args: []string{"--log-format", "xml"}, wantCode: 2, wantMsg: "--log-format"},
		{name: "log level", args: []string{"--log-level", "loud"}, wantCode: 2, wantMsg: "--log-level"},
		{name: "no shutdown grace", args: []string{"--shutdown-grace", "0s"}, wantCode: 2, wantMsg: "--shutdown-grace"},
		{name: "time scale above 1", args: []string{"--time-scale", "2"}, wantCode: 2, wantMsg: "--time-scale"},
		{name: "time scale zero", args: []string{"--time-scale", "0"}, wantCode: 2, wantMsg: "--time-scale"},
		{name: "body size unit", args: []string{"--max-body-size", "12XB"}, wantCode: 2, wantMsg: "max-body-size"},
		{name: "admin address", args: []string{"--admin-addr", "9090"}, wantCode: 2, wantMsg: "--admin-addr"},
		{name: "bad env value", env: map[string]string{"MIRRORWORKER_CONCURRENCY": "many"}, wantCode: 2, wantMsg: "MIRRORWORKER_CONCURRENCY"},
		{name: "target scheme", args: []string{"--target", "gs://bucket/x"}, wantCode: 1, wantMsg: "--target"},
		{name: "data dir is a file", args: []string{"--data-dir", aFile}, wantCode: 1, wantMsg: "--data-dir"},
		{name: "admin port in use", args: []string{"--admin-addr", busy.Addr().String()}, wantCode: 1, wantMsg: "--admin-addr"},
		{name: "embedded port in use", args: []string{"--embedded-listen", busy.Addr().String()}, wantCode: 1, wantMsg: "--embedded-listen"},
		{name: "missing policy file", args: []string{"--policy", filepath.Join(t.TempDir(), "none.json")}, wantCode: 1, wantMsg: "policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"run", "--data-dir", t.TempDir(), "--admin-addr", "127.0.0.1:0", "--embedded-listen", ""}
			args = append(args, tt.args...)
			getenv := func(k string) string { return tt.env[k] }
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stderr strings.Builder
			err := run(ctx, args, getenv, strings.NewReader(""), io.Discard, &stderr)
			if err == nil {
				t.Fatalf("run %q succeeded, want an error", tt.args)
			}
			code := 1
			var ec exitCoder
			if errors.As(err, &ec) {
				code = ec.ExitCode()
			}
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d (error %v)", code, tt.wantCode, err)
			}
			if msg := err.Error() + stderr.String(); !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("error %q (stderr %q) does not mention %q", err, stderr.String(), tt.wantMsg)
			}
			if msg := err.Error() + stderr.String(); strings.Contains(msg, "hunter2") {
				t.Errorf("the error repeats a password: %q", msg)
			}
		})
	}
}

func TestByteSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{in: "0", want: 0},
		{in: "1024", want: 1024},
		{in: "16GiB", want: 16 << 30},
		{in: "500MB", want: 500e6},
		{in: "3 KiB", want: 3 << 10},
		{in: "7B", want: 7},
		{in: "GiB", wantErr: true},
		{in: "1.5GiB", wantErr: true},
		{in: "10XB", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "9000000TiB", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var b byteSize
			err := b.Set(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Set(%q) error %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if err == nil && int64(b) != tt.want {
				t.Errorf("Set(%q) = %d, want %d", tt.in, b, tt.want)
			}
		})
	}
}

// TestPacerPolicyPrecedence: --floor and --max-in-flight apply when there is
// no policy file, yield to the file's default when left at their defaults,
// and win when given explicitly; per-authority entries always stay.
func TestPacerPolicyPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.json")
	policyJSON := `{"default":{"floor":"3s","max_in_flight":5},"authorities":{"slow.example:443":{"floor":"10s","max_in_flight":1}}}`
	if err := os.WriteFile(file, []byte(policyJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		args         []string
		env          map[string]string
		wantFloor    time.Duration
		wantInFlight int
	}{
		{name: "flag defaults, no file", wantFloor: time.Second, wantInFlight: 2},
		{name: "flags, no file", args: []string{"--floor", "0", "--max-in-flight", "8"}, wantFloor: 0, wantInFlight: 8},
		{name: "file default wins over flag defaults", args: []string{"--policy", file}, wantFloor: 3 * time.Second, wantInFlight: 5},
		{name: "explicit flags win over the file", args: []string{"--policy", file, "--floor", "250ms", "--max-in-flight", "1"}, wantFloor: 250 * time.Millisecond, wantInFlight: 1},
		{name: "environment counts as explicit", args: []string{"--policy", file}, env: map[string]string{"MIRRORWORKER_FLOOR": "0s"}, wantFloor: 0, wantInFlight: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c runConfig
			fs := newFlagSet("run", io.Discard)
			c.register(fs)
			if err := parseFlags(fs, tt.args, func(k string) string { return tt.env[k] }); err != nil {
				t.Fatal(err)
			}
			c.explicit = explicitFlags(fs, func(k string) string { return tt.env[k] })
			p, err := c.pacerPolicy()
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Limits("any.example:443"); got.Floor != tt.wantFloor || got.MaxInFlight != tt.wantInFlight {
				t.Errorf("default limits %+v, want floor %s cap %d", got, tt.wantFloor, tt.wantInFlight)
			}
			if c.policy != "" {
				if got := p.Limits("slow.example:443"); got.Floor != 10*time.Second || got.MaxInFlight != 1 {
					t.Errorf("per-authority limits %+v, want the file's 10s and 1", got)
				}
			}
		})
	}
}

// TestRunAdminServesWhileConnecting: with a NATS URL that does not answer
// yet, the admin endpoint is already up: /healthz 200, /readyz 503 with the
// reason (the last connect error once there is one), and the failure is
// logged at error level; cancelling stops the command cleanly.
func TestRunAdminServesWhileConnecting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadNATS := "nats://" + ln.Addr().String()
	ln.Close() // nothing listens there now

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := newLogWatch()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"run", "--nats-url", deadNATS, "--data-dir", t.TempDir(),
			"--admin-addr", "127.0.0.1:0", "--log-level", "debug"}, noEnv, strings.NewReader(""), io.Discard, log)
	}()
	var adminURL string
	waitFor(t, 10*time.Second, "the admin endpoint line", func() bool {
		adminURL = log.field("admin endpoint listening", "admin_url")
		return adminURL != ""
	})
	if code, body := httpGet(t, adminURL+"/healthz"); code != 200 {
		t.Errorf("/healthz while connecting = %d %q, want 200", code, body)
	}
	// The first failed attempt is an error line naming the server, and
	// /readyz then gives its error.
	waitFor(t, 20*time.Second, "the error line of the first failed connect", func() bool {
		return log.logLine("cannot reach NATS; retrying every second", map[string]string{"nats_url": deadNATS, "level": "error"}) != nil
	})
	if code, body := httpGet(t, adminURL+"/readyz"); code != 503 || !strings.Contains(body, "connecting to NATS, retrying every second; last attempt:") {
		t.Errorf("/readyz while connecting = %d %q, want 503 saying it is connecting, with the last error", code, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run cancelled while connecting = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("run did not return after cancel; log:\n%s", log)
	}
}

// TestRunWithSyncFilesystem: with --target-sync filesystem the worker
// stores every object (durable by shared syncfs calls, mirror's tests)
// with its metadata, as with the default.
func TestRunWithSyncFilesystem(t *testing.T) {
	const n = 12
	origin := newObjectOrigin(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	si, log, done := runInProcess(t, ctx,
		"--data-dir", t.TempDir(),
		"--embedded-listen", "127.0.0.1:0",
		"--allow-private-networks",
		"--floor", "0",
		"--max-in-flight", "4",
		"--target-sync", "filesystem",
	)
	enqueueObjects(t, ctx, si.NATSURL, origin.URL, n)
	waitDrained(t, si.NATSURL, si.Mirror, n, 30*time.Second, log)
	stopInProcess(t, cancel, done, log)
	checkMeta(t, si.Mirror, origin, n)
}
