package main

// The README is the front door: every command block in it either runs, as
// written, in TestREADMECommands, or is in readmeExcluded with the reason
// it cannot run here. The test fails when a command is neither (a new
// line nobody checked) and when an entry no longer matches the README.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

// readmeRun says how a command of the README is run: as it is, in the
// background until a condition holds (a server), and what its output
// must contain.
type readmeRun struct {
	want string // in its output
	// bg: start it in the background and wait until ready (a shell
	// condition) holds; the previous background command is stopped first
	// (the README's "Stop with Ctrl-C").
	bg    bool
	ready string
	// before is a shell condition to wait for before the command (a file
	// the worker writes).
	before string
	// env are variables set for this command only: the test's stand-ins
	// for what the reader's network gives (the module proxy is the module
	// cache here, which TestREADMECommands fills first).
	env string
}

// readmeRuns are the README's commands the test runs, in the README's order.
var readmeRuns = map[string]readmeRun{
	"make run": {bg: true, ready: "[ -s data/nats-client.url ]"},
	"go run ./cmd/mirrorworker enqueue 'https://go.dev/VERSION?m=text' --target go/VERSION":                                                      {want: "accepted 1"},
	"mkdir -p /tmp/site/pub && echo hello > /tmp/site/pub/hello.txt":                                                                             {},
	"python3 -m http.server 18765 --bind 127.0.0.1 --directory /tmp/site &":                                                                      {},
	"make run RUN_ARGS=--allow-private-networks":                                                                                                 {bg: true, ready: "[ -s data/nats-client.url ] && (exec 3<>/dev/tcp/127.0.0.1/18765) 2>/dev/null"},
	"go run ./cmd/mirrorworker enqueue http://127.0.0.1:18765/pub/hello.txt":                                                                     {want: "accepted 1"},
	"cat ./data/mirror/127.0.0.1_18765/pub/hello.txt":                                                                                            {before: "[ -s ./data/mirror/127.0.0.1_18765/pub/hello.txt ]", want: "hello"},
	"go run ./cmd/mirrorworker get --allow-private-networks -o /tmp/hello.txt http://127.0.0.1:18765/pub/hello.txt && cat /tmp/hello.txt":        {want: "hello"},
	"mirrorworker enqueue --tenant acme https://files.example.org/a.tar.gz":                                                                      {want: "accepted 1"},
	"mirrorworker enqueue --delete https://files.example.org/pub/a.tar.gz":                                                                       {want: "accepted 1"},
	"mirrorworker enqueue --delete https://files.example.org/pub/b.tar.gz --target pub/b.tar.gz":                                                 {want: "accepted 1"},
	"mirrorworker enqueue < jobs.jsonl":                                                                                                          {want: "accepted 2"},
	`mirrorworker pause  --authority files.example.org:443 --for 30m --reason "asked by their ops"`:                                              {want: "paused files.example.org:443"},
	"mirrorworker resume --authority files.example.org:443":                                                                                      {want: "resumed files.example.org:443"},
	"mirrorworker dlq list --reason http_404 --since 24h":                                                                                        {want: "dead letters"},
	"mirrorworker dlq list --tenant acme --authority https://files.example.org":                                                                  {want: "dead letters"},
	"mirrorworker dlq requeue --dry-run --reason budget_exhausted":                                                                               {want: "dry run: 0 would be requeued"},
	"mirrorworker replay --dry-run":                                                                                                              {want: "dry run:"},
	"mirrorworker dlq requeue --reason auth_failed":                                                                                              {want: "0 requeued"},
	`mirrorworker policy set --authority files.example.org:443 --floor 5s --max-in-flight 1 --for 2h --reason "origin maintenance, ticket 1234"`: {want: "set files.example.org:443"},
	"mirrorworker policy set --default --floor 500ms":                                                                                            {want: "set default"},
	"mirrorworker policy set --authority files.example.org:443 --bandwidth 1MiB/s":                                                               {want: "bandwidth 1MiB/s"},
	"mirrorworker policy set --group example --members 'www.example.org:443,*.cdn.example.org' --floor 1s --max-in-flight 2":                     {want: "members *.cdn.example.org,www.example.org:443"},
	"mirrorworker policy set --group example --add-members downloads.example.org:443":                                                            {want: "downloads.example.org:443"},
	"mirrorworker policy list":                                     {want: "files.example.org:443"},
	"mirrorworker policy show --authority files.example.org:443":   {want: "files.example.org:443"},
	"mirrorworker policy delete --authority files.example.org:443": {want: "deleted files.example.org:443"},
	"mirrorworker status":                                          {},
	"mirrorworker run -h | grep -- -floor":                         {want: "-floor duration"},
	"mirrorworker replay --from-seq 52000":                         {want: "replayed 0 jobs"},
	"go install github.com/versity/versitygw/cmd/versitygw@v1.7.0": {env: "GOPROXY=file://$(go env GOMODCACHE)/cache/download GOSUMDB=off"},
	"mkdir -p /tmp/s3/mirror":                                      {},
	"ROOT_ACCESS_KEY=local ROOT_SECRET_KEY=local-secret VGW_REGION=us-east-1 versitygw --port 127.0.0.1:7070 --quiet posix /tmp/s3 &": {},
	"AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local-secret AWS_REGION=us-east-1 mirrorworker run --target s3://mirror/pypi --s3-endpoint http://127.0.0.1:7070": {
		bg: true, before: "(exec 3<>/dev/tcp/127.0.0.1/7070) 2>/dev/null",
		ready: `python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8081/readyz")' 2>/dev/null`},
	"mirrorworker stub-origin --profile testdata/profiles/throttling.json --listen 127.0.0.1:18080 --authorities 50 --admin-listen 127.0.0.1:18079": {
		bg: true, ready: "(exec 3<>/dev/tcp/127.0.0.1/18079) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/18080) 2>/dev/null"},
}

// readmeExcluded are the README's commands that cannot run in a test on
// loopback, and why.
var readmeExcluded = map[string]string{
	"make test": "the test suite itself: this test runs inside it",
	"mirrorworker run --nats-url nats://nats-1:4222,nats://nats-2:4222 --nats-creds /etc/mirrorworker/worker.creds --data-dir /var/lib/mirrorworker --target file:///srv/mirror": "needs an existing NATS cluster (nats-1, nats-2), a credentials file and /srv (TestProcessBadNATSCredentials runs a worker against a server with credentials)",
	"mirrorworker status [--authority files.example.org:443] [--json]": "usage notation: the brackets mark optional flags (TestProcessCommandsFindWorkerByDataDir runs status)",
	"mirrorworker dlq show 42":                     "needs a dead letter at sequence 42 (TestDLQListShowRequeue runs show)",
	"mirrorworker dlq requeue 42 43":               "needs dead letters at sequences 42 and 43 (TestDLQListShowRequeue runs requeue)",
	"mirrorworker replay --target /srv/mirror-new": "writes /srv/mirror-new on the host, and fetches every job again (TestProcessReplayKeepsTheLiveDLQ replays into a new target)",
	"mirrorworker replay":                          "fetches every job of the stream again, here jobs of origins that do not exist, retried for minutes (the replay tests run it)",
	"mirrorworker replay --since 24h --authority https://files.example.org/ --tenant acme":                                                                          "fetches files.example.org, which does not exist here, retried for minutes (replay's filter tests)",
	"go run ./cmd/mirrorworker loadtest --jobs 5000 --authorities 50 --workers 3 --profile testdata/profiles/loadtest-throttling.json --strategy all --report out/": "minutes of CPU for every strategy (the load test's own tests run it small)",
	"make bench-politeness": "real-time runs against rate limiters, up to an hour (TestPolitenessOnNginxLikeOrigin in package loadtest is its short form)",
	"MW_BENCH_POLITENESS_CELLS=2:100ms,10:0,2:curl,10:curl MW_BENCH_POLITENESS_PARALLEL=4 MW_BENCH_POLITENESS_REPORT=out/politeness make bench-politeness": "real-time runs against rate limiters, about 20 minutes (TestPolitenessOnNginxLikeOrigin in package loadtest is its short form)",
	"make image": "minutes to cross-build a static binary (deploy/image and deploy/cmd/mkimage test the image and what mkimage prints)",
	"docker load -i bin/mirrorworker-image.tar":                                                             "needs Docker",
	"kubectl apply -k deploy/kubernetes/overlays/external-nats":                                             "needs a Kubernetes cluster (deploy's tests render both kustomizations)",
	"kubectl apply -k deploy/kubernetes/overlays/s3":                                                        "needs a Kubernetes cluster and a bucket (deploy's tests render the s3 overlay)",
	"export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...":                                                "placeholders for a bucket's keys (the S3 tests set real ones for a versitygw they start)",
	"mirrorworker run --target s3://mirror/pypi --s3-endpoint https://s3.example.net --s3-region eu-west-1": "needs an S3 endpoint (TestS3MirrorEndToEnd runs run into a versitygw bucket)",
	"mirrorworker replay --target s3://mirror-new/pypi --s3-endpoint https://s3.example.net":                "needs an S3 endpoint (TestS3MirrorEndToEnd replays into a bucket)",
	"mirrorworker replay --target s3://mirror/pypi --s3-endpoint https://s3.example.net":                    "needs an S3 endpoint (TestS3MirrorEndToEnd's re-check is answered 304)",
	"mirrorworker verify": "at this point of the README the go.dev job cannot be fetched (no network here), so verify rightly reports it missing (TestVerifyFindsAndRepairs runs verify)",
	"mirrorworker verify --target s3://mirror/pypi --s3-endpoint https://s3.example.net": "needs an S3 endpoint (TestVerifyFindsAndRepairs verifies a versitygw bucket)",
	"mirrorworker verify --target /srv/mirror --repair":                                  "needs a mirror at /srv/mirror (TestVerifyFindsAndRepairs repairs a file target)",
	"mirrorworker verify --target /srv/mirror --repair-dead-letters":                     "needs a mirror at /srv/mirror (TestVerifyDeadLettersApart requeues a dead-lettered job)",
}

// readmeGiven are files a command of the README reads, written before the
// commands run: the README's reader has their own.
var readmeGiven = map[string]string{
	"jobs.jsonl": `{"url": "https://files.example.org/pub/b.tar.gz", "tenant": "acme"}` + "\n" +
		`{"url": "https://files.example.org/pub/c.tar.gz"}` + "\n",
}

type readmeCmd struct {
	line int
	text string
}

// readmeCommands returns the shell commands of the README: the lines of
// its indented code blocks and of its sh fences, continuations joined,
// comments (expected output, a trailing "# note") dropped.
func readmeCommands(t *testing.T) []readmeCmd {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []readmeCmd
	var cont *readmeCmd
	add := func(n int, l string) {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			return
		}
		l = trailingNote.ReplaceAllString(l, "") // "cmd   # note"
		joined := strings.HasSuffix(l, `\`)
		l = strings.TrimSpace(strings.TrimSuffix(l, `\`))
		if cont != nil {
			cont.text += " " + l
		} else {
			out = append(out, readmeCmd{line: n, text: l})
			cont = &out[len(out)-1]
		}
		if !joined {
			cont = nil
		}
	}
	fence, indented, prevBlank := "", false, true
	for i, l := range strings.Split(string(b), "\n") {
		n := i + 1
		switch {
		case fence != "":
			if strings.HasPrefix(l, "```") {
				fence = ""
			} else if fence == "sh" || fence == "bash" || fence == "shell" {
				add(n, l)
			}
		case strings.HasPrefix(l, "```"):
			fence = strings.TrimSpace(l[3:])
			if fence == "" {
				fence = "text"
			}
		case strings.HasPrefix(l, "    ") && (prevBlank || indented):
			indented = true
			add(n, l)
		case strings.TrimSpace(l) != "":
			indented = false
		}
		prevBlank = strings.TrimSpace(l) == ""
	}
	return out
}

// TestREADMECommands runs the README's commands as written, in its order,
// in a network namespace of their own (only its loopback exists: nothing
// leaves the machine, and the README's fixed ports, 4222, 8081 and 18765,
// clash with nothing) over a copy of the repository, with /tmp a private
// tmpfs. `mirrorworker` is what `make install` installs, as the README
// says.
func TestREADMECommands(t *testing.T) {
	cmds := readmeCommands(t)
	inREADME := map[string]bool{}
	for _, c := range cmds {
		inREADME[c.text] = true
		_, run := readmeRuns[c.text]
		why, excluded := readmeExcluded[c.text]
		switch {
		case run && excluded:
			t.Errorf("README line %d is both run and excluded: %q", c.line, c.text)
		case !run && !excluded:
			t.Errorf("README line %d is neither run nor excluded (add it to readmeRuns, or to readmeExcluded with the reason): %q", c.line, c.text)
		case excluded && len(why) < 10:
			t.Errorf("README line %d: exclusion without a reason: %q", c.line, c.text)
		}
	}
	for c := range readmeRuns {
		if !inREADME[c] {
			t.Errorf("readmeRuns names a command the README no longer has: %q", c)
		}
	}
	for c := range readmeExcluded {
		if !inREADME[c] {
			t.Errorf("readmeExcluded names a command the README no longer has: %q", c)
		}
	}
	if t.Failed() {
		return
	}
	if testing.Short() {
		t.Skip("builds and runs the README's commands (minutes)")
	}
	for _, tool := range []string{"bash", "make", "python3", "mount", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOptional(t, fmt.Sprintf("%s skipped: the README's commands need %s", t.Name(), tool))
		}
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	// The S3 recipe's go install reads the module cache, where the S3
	// tests' own build of versitygw puts it.
	buckettest.Binary(t)
	script := readmeScript(cmds, repo, goCachesUnderTmp(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Env = readmeEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var startErr *os.PathError
	if err != nil && cmd.ProcessState == nil && (errors.As(err, &startErr) || strings.Contains(err.Error(), "operation not permitted")) {
		// Not an installable dependency: a kernel or container that
		// refuses user namespaces. Skipped even under CI=true, and said.
		recordSkip(fmt.Sprintf("%s skipped: no user and network namespace for the README's fixed ports (%v)", t.Name(), err))
		t.Skipf("no user and network namespace for the README's fixed ports (%v)", err)
	}
	ran := strings.Count(out.String(), "README-OK ")
	if err != nil || ran != readmeRunCount(cmds) {
		t.Fatalf("the README's commands: %v (%d of %d ran as written); output:\n%s", err, ran, readmeRunCount(cmds), out.String())
	}
	t.Logf("%d README commands ran as written, %d excluded (readmeExcluded)", ran, len(readmeExcluded))
}

func readmeRunCount(cmds []readmeCmd) int {
	n := 0
	for _, c := range cmds {
		if _, ok := readmeRuns[c.text]; ok {
			n++
		}
	}
	return n
}

// readmeEnv is the environment of a newcomer's shell: no MIRRORWORKER_
// variable, mirrorworker on PATH from make install, and no module
// downloads (there is no network).
func readmeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MIRRORWORKER_") && !strings.HasPrefix(kv, "GOBIN=") && !strings.HasPrefix(kv, "PATH=") &&
			!strings.HasPrefix(kv, "GOPROXY=") && !strings.HasPrefix(kv, "GOFLAGS=") && !strings.HasPrefix(kv, asMainEnv+"=") {
			env = append(env, kv)
		}
	}
	return append(env, "GOBIN=/tmp/gobin", "PATH=/tmp/gobin:"+os.Getenv("PATH"), "GOPROXY=off", "GOFLAGS=-mod=mod")
}

var (
	shellQuote   = regexp.MustCompile(`'`)
	trailingNote = regexp.MustCompile(`\s{2,}#.*$`)
)

func sq(s string) string { return "'" + shellQuote.ReplaceAllString(s, `'\''`) + "'" }

// goCachesUnderTmp are the Go module and build caches that lie under
// /tmp, which the script's private /tmp would hide: without them `make
// install` finds no module (GOPROXY=off) and no command runs.
func goCachesUnderTmp(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMODCACHE", "GOCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	var under []string
	for _, d := range strings.Fields(string(out)) {
		if d == "/tmp" || strings.HasPrefix(d, "/tmp/") {
			under = append(under, d)
		}
	}
	return under
}

// readmeScript is the bash script that runs the commands: set up the
// namespace (loopback up, /tmp private, with keep, the Go caches under
// /tmp, bound back in), copy the repository, make install, write the
// given files, then each command in order.
func readmeScript(cmds []readmeCmd, repo string, keep []string) string {
	// A directory under /tmp stays reachable through a descriptor opened
	// before the tmpfs hides it, and is bound back at its path from there.
	var keepOpen, keepBound string
	for i, d := range keep {
		fd := 20 + i
		keepOpen += fmt.Sprintf("exec %d<%s || fail 0 %s\n", fd, sq(d), sq("open "+d))
		keepBound += fmt.Sprintf("mkdir -p %s && mount --no-canonicalize --bind /proc/self/fd/%d %s || fail 0 %s\n", sq(d), fd, sq(d), sq("bind "+d+" back under the private /tmp"))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `set -u
fail() { echo "README-FAIL line $1: $2"; for f in /tmp/bg-*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }; done; exit 1; }
waitfor() { local end=$((SECONDS+$1)); until eval "$2"; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done; }
BG=
stopbg() { if [ -n "$BG" ]; then kill -TERM -- -$BG 2>/dev/null; waitfor 90 "! kill -0 $BG 2>/dev/null" || fail 0 "background command $BG did not stop"; BG=; fi; }
cleanup() { stopbg; kill $(jobs -p) 2>/dev/null; }
trap cleanup EXIT
set -m
# The working directory keeps the repository reachable even when it lies
# under /tmp, which the tmpfs hides by name.
cd %s || fail 0 "enter the repository"
%smount -t tmpfs tmpfs /tmp || fail 0 "mount a tmpfs on /tmp"
%s(cd / && python3 -c 'import socket,fcntl,struct; s=socket.socket(); fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", 0x41, b""))') || fail 0 "bring the loopback up"
mkdir -p /tmp/repo && tar -C . --exclude=./data --exclude=./bin --exclude=./out --exclude=./.test-skipped -cf - . | tar -C /tmp/repo -xf - || fail 0 "copy the repository"
cd /tmp/repo
make install >/tmp/make-install.log 2>&1 || { cat /tmp/make-install.log; fail 0 "make install"; }
`, sq(repo), keepOpen, keepBound)
	for name, content := range readmeGiven {
		fmt.Fprintf(&b, "printf '%%s' %s > %s\n", sq(content), sq(name))
	}
	for _, c := range cmds {
		r, ok := readmeRuns[c.text]
		if !ok {
			continue
		}
		if r.before != "" {
			fmt.Fprintf(&b, "waitfor 120 %s || fail %d %s\n", sq(r.before), c.line, sq("waited for "+r.before))
		}
		switch {
		case r.bg:
			fmt.Fprintf(&b, "stopbg\n%s >/tmp/bg-%d.log 2>&1 &\nBG=$!\n", c.text, c.line)
			fmt.Fprintf(&b, "waitfor 600 %s || fail %d %s\n", sq(r.ready), c.line, sq("not ready: "+r.ready))
		case strings.HasSuffix(c.text, "&"):
			fmt.Fprintf(&b, "%s\n", c.text)
		default:
			env := ""
			if r.env != "" {
				env = "env " + r.env + " "
			}
			fmt.Fprintf(&b, "out=$( %s%s 2>&1 ); rc=$?\n", env, c.text)
			fmt.Fprintf(&b, "[ $rc -eq 0 ] || fail %d \"exit $rc: $out\"\n", c.line)
			if r.want != "" {
				fmt.Fprintf(&b, "case \"$out\" in *%s*) ;; *) fail %d \"output lacks %s: $out\";; esac\n", sq(r.want), c.line, strings.ReplaceAll(r.want, `"`, `\"`))
			}
		}
		fmt.Fprintf(&b, "echo %s\n", sq(fmt.Sprintf("README-OK line %d: %s", c.line, c.text)))
	}
	return b.String()
}

// skipOptional skips for a missing optional dependency, failing under
// CI=true, with a line for `make test` to print (MW_SKIPPED_FILE).
func skipOptional(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	recordSkip(msg)
	t.Skip(msg)
}

// recordSkip adds a line for `make test` to print at its end.
func recordSkip(msg string) {
	if f := os.Getenv("MW_SKIPPED_FILE"); f != "" {
		if fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(fh, "cmd/mirrorworker: "+msg)
			fh.Close()
		}
	}
}
