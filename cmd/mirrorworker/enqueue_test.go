package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
	"github.com/nats-io/nats.go/jetstream"
)

// enqueueServer starts an embedded JetStream server listening on a random
// loopback port, as `mirrorworker run` does on 127.0.0.1:4222, and returns
// its URL and a JetStream context to inspect the streams.
func enqueueServer(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	e := brokertest.Start(t, broker.EmbeddedOptions{Listen: "127.0.0.1:0"})
	js, _ := brokertest.JetStream(t, e)
	return e.ClientURL(), js
}

type enqueueResult struct {
	err            error
	stdout, stderr string
}

func runEnqueue(t *testing.T, env map[string]string, stdin string, args ...string) enqueueResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string { return env[k] }
	err := run(ctx, append([]string{"enqueue"}, args...), getenv, strings.NewReader(stdin), &stdout, &stderr)
	return enqueueResult{err, stdout.String(), stderr.String()}
}

// streamJobs returns the jobs in MIRROR_JOBS by subject, checking each body.
func streamJobs(t *testing.T, js jetstream.JetStream) map[string][]jobs.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]jobs.Job{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		j, err := jobs.Parse(m.Data)
		if err != nil {
			t.Fatalf("message %d on the stream is invalid: %v", seq, err)
		}
		if err := jobs.CheckSubject(j, m.Subject); err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != j.ID {
			t.Fatalf("message %d: Nats-Msg-Id %q, want %q", seq, got, j.ID)
		}
		// Keyed by the subject the job was published on: the stream stores
		// it with its partition as a fifth token.
		tenant, akey, err := jobs.ParseSubject(m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		pub := jobs.JobsSubjectPrefix + tenant + "." + akey
		out[pub] = append(out[pub], j)
	}
	return out
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ec exitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

func TestEnqueueURLArguments(t *testing.T) {
	url, js := enqueueServer(t)

	r := runEnqueue(t, nil, "", "--nats-url", url, "https://files.example.org/a.tar.gz", "http://h.example:8080/dir/")
	if r.err != nil || r.stdout != "accepted 2\n" {
		t.Fatalf("enqueue: %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}
	got := streamJobs(t, js)
	if len(got["mirror.jobs.default.files_example_org_443"]) != 1 || len(got["mirror.jobs.default.h_example_8080"]) != 1 {
		t.Fatalf("stream holds %v", got)
	}
	if j := got["mirror.jobs.default.h_example_8080"][0]; j.Target != "h.example_8080/dir/index" {
		t.Errorf("target %q", j.Target)
	}

	// The same URLs again are duplicates of the same job ids: nothing new is stored.
	r = runEnqueue(t, nil, "", "--nats-url", url, "https://files.example.org/a.tar.gz", "http://h.example:8080/dir/")
	if r.err != nil || r.stdout != "accepted 2 (2 duplicates)\n" {
		t.Fatalf("second enqueue: %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}
	if got := streamJobs(t, js); len(got) != 2 {
		t.Errorf("after duplicates the stream holds %v", got)
	}
}

func TestEnqueueJobFlags(t *testing.T) {
	url, js := enqueueServer(t)
	// MIRRORWORKER_TARGET configures the worker's mirror target; enqueue must
	// not take it as the job's target key. The NATS URL does come from the environment.
	env := map[string]string{"MIRRORWORKER_NATS_URL": url, "MIRRORWORKER_TARGET": "file:///srv/mirror", "MIRRORWORKER_TENANT": "envtenant"}

	r := runEnqueue(t, env, "", "--tenant", "acme", "--kind", "metadata", "--target", "pub/a.json", "https://h.example/a.json?x=1")
	if r.err != nil || r.stdout != "accepted 1\n" {
		t.Fatalf("enqueue: %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}
	r = runEnqueue(t, env, "", "https://h.example/b", "https://h.example/c")
	if r.err != nil || r.stdout != "accepted 2\n" {
		t.Fatalf("enqueue with environment: %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}
	got := streamJobs(t, js)
	acme := got["mirror.jobs.acme.h_example_443"]
	if len(acme) != 1 || acme[0].Target != "pub/a.json" || acme[0].Kind != "metadata" || acme[0].Tenant != "acme" {
		t.Errorf("acme jobs %+v", acme)
	}
	if def := got["mirror.jobs.default.h_example_443"]; len(def) != 2 || def[0].Target != "h.example/b" {
		t.Errorf("default jobs %+v", def)
	}
}

func TestEnqueueUsageErrors(t *testing.T) {
	tests := []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"target with two URLs", "", []string{"--target", "x", "http://a.example/", "http://b.example/"}, "exactly one URL"},
		{"target with stdin", `{"url":"http://a.example/"}`, []string{"--target", "x"}, "JSON lines"},
		{"tenant with dash", `{"url":"http://a.example/"}`, []string{"--tenant", "acme", "-"}, "JSON lines"},
		{"stdin twice", "", []string{"-", "-"}, "once"},
		{"unknown flag", "", []string{"--bogus"}, "bogus"},
		{"unknown flag says where help is", "", []string{"http://a.example/", "--bogus"}, "run 'mirrorworker enqueue -h' for the flags"},
		{"id with two URLs", "", []string{"http://a.example/", "--id", "x", "http://b.example/"}, "--id needs exactly one URL argument"},
		{"id with stdin", `{"url":"http://a.example/"}`, []string{"--id", "x"}, "JSON lines"},
		{"flag without its value at the end", "", []string{"http://a.example/", "--target"}, "--target needs a value"},
		{"deprecated spelling with a bad value", "", []string{"--connect-timeout", "soon", "http://a.example/"}, `--connect-timeout "soon"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// No server: a usage error is reported before connecting.
			r := runEnqueue(t, nil, tt.stdin, append([]string{"--nats-url", "nats://127.0.0.1:1"}, tt.args...)...)
			if exitCode(r.err) != 2 || !strings.Contains(r.err.Error(), tt.want) {
				t.Fatalf("got %v (exit %d), want a usage error about %q", r.err, exitCode(r.err), tt.want)
			}
		})
	}
}

func TestEnqueueStdinLines(t *testing.T) {
	url, js := enqueueServer(t)
	stdin := strings.Join([]string{
		`{"url":"https://h.example/one","tenant":"acme"}`,
		``,
		`{"url":"ftp://h.example/two"}`,
		`   `,
		`{"url":"https://h.example/three",`,
		"{\"url\":\"https://h.example/four\",\"sha256\":\"" + strings.Repeat("AB", 32) + "\"}\r",
		`{"v":3,"url":"https://h.example/five"}`,
		`{"url":"https://h.example/a/%2e%2e/%2e%2e/etc/passwd"}`,
		`{"url":"https://h.example/one","tenant":"acme"}`, // a duplicate of line 1 in the same run
		`{"url":"http://h.example/six"}`,                  // no final newline
	}, "\n")
	r := runEnqueue(t, nil, stdin, "--nats-url", url)
	if exitCode(r.err) != 1 {
		t.Fatalf("exit %d (%v), want 1", exitCode(r.err), r.err)
	}
	if r.stdout != "accepted 4 (1 duplicate)\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	wantStderr := []string{
		"line 3: url: must be an absolute http or https URL",
		"line 5: malformed JSON",
		"line 7: v: version 3 is newer",
		`line 8: target: the default "h.example/a/../../etc/passwd"`,
		"line 9: duplicate of job ",
		`note: a duplicate is a job id enqueued within the last 2m0s (the stream's duplicate window): it is not queued again, and if it was stored already nothing is fetched. To fetch it again now, give the job a new "id"; or wait 2m0s`,
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if len(lines) != len(wantStderr) {
		t.Fatalf("stderr has %d lines, want %d:\n%s", len(lines), len(wantStderr), r.stderr)
	}
	for i, w := range wantStderr {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("stderr line %d = %q, want prefix %q", i+1, lines[i], w)
		}
	}
	got := streamJobs(t, js)
	if len(got["mirror.jobs.acme.h_example_443"]) != 1 || len(got["mirror.jobs.default.h_example_443"]) != 1 || len(got["mirror.jobs.default.h_example_80"]) != 1 {
		t.Errorf("stream holds %v", got)
	}
	if j := got["mirror.jobs.default.h_example_443"][0]; j.SHA256 != strings.Repeat("ab", 32) {
		t.Errorf("sha256 %q not normalised", j.SHA256)
	}

	// "-" reads standard input too, mixed with URL arguments.
	r = runEnqueue(t, nil, `{"url":"https://h.example/seven"}`+"\n", "--nats-url", url, "https://h.example/eight", "-")
	if r.err != nil || r.stdout != "accepted 2\n" {
		t.Fatalf("URL and '-': %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}
}

func TestEnqueueLongLine(t *testing.T) {
	url, js := enqueueServer(t)
	long := `{"url":"https://h.example/x","pad":"` + strings.Repeat("p", 3*jobs.MaxJobLen) + `"}`
	stdin := long + "\n" + `{"url":"https://h.example/after"}` + "\n"
	r := runEnqueue(t, nil, stdin, "--nats-url", url)
	if exitCode(r.err) != 1 || !strings.HasPrefix(r.stderr, "line 1: longer than") || r.stdout != "accepted 1\n" {
		t.Fatalf("exit %d (%v)\nstdout %q\nstderr %q", exitCode(r.err), r.err, r.stdout, r.stderr)
	}
	if got := streamJobs(t, js); len(got["mirror.jobs.default.h_example_443"]) != 1 {
		t.Errorf("stream holds %v", got)
	}
}

func TestEnqueueDryRun(t *testing.T) {
	url, js := enqueueServer(t)
	stdin := `{"url":"https://h.example/one"}` + "\n" + `{"url":"nope"}` + "\n"
	r := runEnqueue(t, nil, stdin, "--nats-url", url, "--dry-run")
	if exitCode(r.err) != 1 || r.stdout != "valid 1 (dry run: nothing published)\n" || !strings.HasPrefix(r.stderr, "line 2: url: ") {
		t.Fatalf("exit %d (%v)\nstdout %q\nstderr %q", exitCode(r.err), r.err, r.stdout, r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, jobs.JobsStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a dry run touched the server: stream lookup gave %v", err)
	}
}

func TestEnqueueKeepsOperatorStreamLimits(t *testing.T) {
	url, js := enqueueServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{JobsMaxAge: 36 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	r := runEnqueue(t, nil, "", "--nats-url", url, "https://h.example/x")
	if r.err != nil {
		t.Fatalf("enqueue: %v %s", r.err, r.stderr)
	}
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAge != 36*time.Hour {
		t.Errorf("enqueue reset the jobs stream MaxAge to %s", info.Config.MaxAge)
	}
}

func TestEnqueueNoServer(t *testing.T) {
	r := runEnqueue(t, nil, "", "--nats-url", "nats://127.0.0.1:1", "--connect-timeout", "200ms", "https://h.example/x")
	if exitCode(r.err) != 1 || r.stdout != "" {
		t.Fatalf("exit %d (%v), stdout %q", exitCode(r.err), r.err, r.stdout)
	}
}

func TestReadLines(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // "!" marks a line reported too long
	}{
		{"empty", "", nil},
		{"one without newline", "a", []string{"a"}},
		{"crlf and blank", "a\r\n\nb\n", []string{"a", "", "b"}},
		{"long then short", strings.Repeat("x", 20) + "\nshort\n", []string{"!", "short"}},
		{"long last line", "ok\n" + strings.Repeat("x", 20), []string{"ok", "!"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			err := readLines(io.MultiReader(strings.NewReader(tt.in)), 10, func(n int, line []byte, tooLong bool) error {
				if n != len(got)+1 {
					t.Errorf("line number %d after %d lines", n, len(got))
				}
				if tooLong {
					got = append(got, "!")
				} else {
					got = append(got, string(line))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") || len(got) != len(tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestEnqueueFlagsAnywhere: flags after the URL are flags (the README's
// line), "--" ends them, and a query-string URL without --target says what
// to pass.
func TestEnqueueFlagsAnywhere(t *testing.T) {
	url, js := enqueueServer(t)

	r := runEnqueue(t, nil, "", "https://go.dev/VERSION?m=text", "--target", "go/VERSION", "--nats-url", url)
	if r.err != nil || r.stdout != "accepted 1\n" || r.stderr != "" {
		t.Fatalf("flags after the URL: %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}
	if j := streamJobs(t, js)["mirror.jobs.default.go_dev_443"]; len(j) != 1 || j[0].Target != "go/VERSION" || j[0].URL != "https://go.dev/VERSION?m=text" {
		t.Fatalf("stream holds %+v", j)
	}

	// Flags between URLs, --flag=value, and a bool flag that takes no value.
	r = runEnqueue(t, nil, "", "--nats-url="+url, "https://h.example/a", "--tenant", "acme", "--dry-run", "https://h.example/b")
	if r.err != nil || r.stdout != "valid 2 (dry run: nothing published)\n" {
		t.Fatalf("flags between URLs: %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}

	// After "--" a word starting with '-' is an argument (here a bad URL).
	r = runEnqueue(t, nil, "", "--nats-url", url, "--dry-run", "--", "--target")
	if exitCode(r.err) != 1 || !strings.Contains(r.stderr, "argument 1: url: ") {
		t.Fatalf("after --: %v\nstderr %q", r.err, r.stderr)
	}

	r = runEnqueue(t, nil, "", "--nats-url", url, "--dry-run", "https://go.dev/VERSION?m=text")
	if exitCode(r.err) != 1 || !strings.Contains(r.stderr, "argument 1: target: is required for a URL with a query string (pass --target KEY") {
		t.Fatalf("query string without --target: %v\nstderr %q", r.err, r.stderr)
	}
	r = runEnqueue(t, nil, "", "--nats-url", url, "--dry-run", "go.dev/VERSION")
	if exitCode(r.err) != 1 || !strings.Contains(r.stderr, "(give absolute http:// or https:// URLs") {
		t.Fatalf("URL without a scheme: %v\nstderr %q", r.err, r.stderr)
	}
}

// TestEnqueueWarnsAboutRefusedDestinations: a loopback or private URL is
// enqueued, with one warning per host naming the flag the worker needs.
func TestEnqueueWarnsAboutRefusedDestinations(t *testing.T) {
	tests := []struct {
		name, url, want string
	}{
		{"loopback", "http://127.0.0.1:8000/pub/hello.txt", "127.0.0.1 is a loopback address: a worker refuses it (dead letter destination_refused) unless it runs with --allow-private-networks (make run RUN_ARGS=--allow-private-networks)"},
		{"localhost", "http://localhost:8000/a", "localhost is a loopback address"},
		{"private", "http://10.1.2.3/a", "10.1.2.3 is a private address"},
		{"IPv6 loopback", "http://[::1]:8000/a", "::1 is a loopback address"},
		{"metadata is refused always", "http://169.254.169.254/latest", "169.254.169.254 is refused by every worker (metadata)"},
		{"public", "https://files.example.org/a", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runEnqueue(t, nil, "", "--dry-run", tt.url)
			if tt.want == "" {
				if r.stderr != "" {
					t.Fatalf("unexpected stderr %q", r.stderr)
				}
				return
			}
			if !strings.Contains(r.stderr, "warning: argument 1: "+tt.want) {
				t.Fatalf("stderr %q, want the warning %q", r.stderr, tt.want)
			}
		})
	}
	// One warning per host, however many jobs.
	r := runEnqueue(t, nil, "", "--dry-run", "http://127.0.0.1:1/a", "http://127.0.0.1:1/b")
	if r.err != nil || strings.Count(r.stderr, "warning:") != 1 {
		t.Fatalf("%v; stderr %q, want one warning", r.err, r.stderr)
	}
}

// TestEnqueueBelievesTheWorkersAnnouncement: the loopback warning is given
// unless the workers announced in MIRROR_PODS run with
// --allow-private-networks (issue 36 item 6: it was given while the worker
// found ran with the flag); one worker without it keeps the warning, and a
// destination refused by every worker is warned of whatever they announce.
func TestEnqueueBelievesTheWorkersAnnouncement(t *testing.T) {
	tests := []struct {
		name  string
		pods  map[string]bool // pod -> allow_private_networks
		url   string
		wants string // "" for no warning
	}{
		{"no worker announced", nil, "http://127.0.0.1:8000/a", "127.0.0.1 is a loopback address"},
		{"the worker allows it", map[string]bool{"w1": true}, "http://127.0.0.1:8000/a", ""},
		{"every worker allows it", map[string]bool{"w1": true, "w2": true}, "http://10.1.2.3/a", ""},
		{"one worker does not", map[string]bool{"w1": true, "w2": false}, "http://127.0.0.1:8000/a", "127.0.0.1 is a loopback address"},
		{"the worker does not", map[string]bool{"w1": false}, "http://[::1]:8000/a", "::1 is a loopback address"},
		{"metadata is refused always", map[string]bool{"w1": true}, "http://169.254.169.254/latest", "169.254.169.254 is refused by every worker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, js := enqueueServer(t)
			if tt.pods != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				kv, err := js.CreateKeyValue(ctx, jobs.PodsBucketConfig(time.Minute, 1))
				if err != nil {
					t.Fatal(err)
				}
				for pod, allow := range tt.pods {
					b, _ := json.Marshal(worker.PodStatus{Pod: pod, AllowPrivateNetworks: allow})
					if _, err := kv.Put(ctx, pod, b); err != nil {
						t.Fatal(err)
					}
				}
			}
			r := runEnqueue(t, nil, "", tt.url, "--nats-url", url)
			if r.err != nil {
				t.Fatalf("%v: %s", r.err, r.stderr)
			}
			switch {
			case tt.wants == "" && strings.Contains(r.stderr, "warning"):
				t.Errorf("warned: %q", r.stderr)
			case tt.wants != "" && !strings.Contains(r.stderr, "warning: argument 1: "+tt.wants):
				t.Errorf("stderr %q, want the warning %q", r.stderr, tt.wants)
			}
		})
	}
}

// TestEnqueueDuplicateSaysWhatToDo: the same URL again is a duplicate, said
// so with what to do; a new --id queues it again.
func TestEnqueueDuplicateSaysWhatToDo(t *testing.T) {
	url, js := enqueueServer(t)
	if r := runEnqueue(t, nil, "", "https://h.example/a", "--nats-url", url); r.err != nil {
		t.Fatalf("%v: %s", r.err, r.stderr)
	}
	r := runEnqueue(t, nil, "", "https://h.example/a", "--nats-url", url)
	if r.err != nil || r.stdout != "accepted 1 (1 duplicate)\n" {
		t.Fatalf("again: %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}
	for _, want := range []string{"argument 1: duplicate of job ", "To fetch it again now, pass a new --id; or wait 2m0s"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	r = runEnqueue(t, nil, "", "https://h.example/a", "--id", "again-1", "--nats-url", url)
	if r.err != nil || r.stdout != "accepted 1\n" {
		t.Fatalf("with --id: %v\nstdout %q\nstderr %q", r.err, r.stdout, r.stderr)
	}
	if got := streamJobs(t, js)["mirror.jobs.default.h_example_443"]; len(got) != 2 || got[1].ID != "again-1" {
		t.Fatalf("stream holds %+v", got)
	}
}
