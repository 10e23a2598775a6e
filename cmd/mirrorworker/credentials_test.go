package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/deadletter"
	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// authOrigin serves /obj/<name> to requests that pass check, 401 to the
// others, and counts both.
type authOrigin struct {
	*httptest.Server
	check func(r *http.Request) bool

	ok, refused atomic.Int64
	// throttleFirst: the next request gets a 429 with Retry-After: 1.
	throttleFirst atomic.Bool
	mu            sync.Mutex
	lastRefused   time.Time
}

func newAuthOrigin(t *testing.T, tlsConf *fetchtest.CA, check func(r *http.Request) bool) *authOrigin {
	t.Helper()
	o := &authOrigin{check: check}
	o.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.throttleFirst.CompareAndSwap(true, false) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		if !o.check(r) {
			o.refused.Add(1)
			o.mu.Lock()
			o.lastRefused = time.Now()
			o.mu.Unlock()
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		o.ok.Add(1)
		fmt.Fprintf(w, "object %s\n", r.URL.Path)
	}))
	if tlsConf != nil {
		tc, err := tlsConf.ServerTLS(true, "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		o.TLS = tc
		o.StartTLS()
	} else {
		o.Start()
	}
	t.Cleanup(o.Close)
	return o
}

func (o *authOrigin) hostPort() string { return o.Listener.Addr().String() }

// writeCreds writes the credentials file atomically, as a Secret update
// swaps the files in one step.
func writeCreds(t *testing.T, dir, body string) {
	t.Helper()
	tmp := filepath.Join(dir, ".creds.tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "credentials.json")); err != nil {
		t.Fatal(err)
	}
}

func enqueueURLs(t *testing.T, natsURL string, urls ...string) {
	t.Helper()
	var lines strings.Builder
	for _, u := range urls {
		fmt.Fprintf(&lines, "{\"url\":%q}\n", u)
	}
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"enqueue", "--nats-url", natsURL}, noEnv, strings.NewReader(lines.String()), &out, &errOut); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errOut.String())
	}
}

// streamBytes is every message (subject, headers and data) of a stream.
func streamBytes(t *testing.T, js jetstream.JetStream, stream string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		fmt.Fprintf(&b, "%s %v %s\n", m.Subject, m.Header, m.Data)
	}
	return b.String()
}

// TestPrivateUpstreams runs the worker in this process with --credentials
// against origins that require a bearer token, basic authentication, a
// custom header and a client certificate (a CA made here), and one whose
// credential is wrong:
//   - every job of the right credentials is stored;
//   - the wrong one is dead-lettered auth_failed, with a bounded number of
//     requests (no retry storm), and counted per authority;
//   - a rotation mid-run (the origin switches tokens, then the file is
//     rewritten) is picked up without a restart, and no job is lost;
//   - after the file is fixed, dlq requeue --reason auth_failed brings the
//     dead letters back and they are stored;
//   - no secret appears in the JSON log, the console log (a second run),
//     the dead letters, the events, the attempts bucket, the metrics,
//     /debug/pacer or status.
func TestPrivateUpstreams(t *testing.T) {
	t.Parallel()
	ca, err := fetchtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	const (
		bearerTok   = "bearer-SECRET-b7c1"
		basicPass   = "basic-SECRET-93aa"
		headerVal   = "header-SECRET-5d02"
		wrongTok    = "wrong-SECRET-e611"
		rightTok    = "right-SECRET-0f4d"
		rotOld      = "rotation-old-SECRET-77ab"
		rotNew      = "rotation-new-SECRET-c3d9"
		wrongTok2   = "wrong2-SECRET-aa10"
		perOrigin   = 5
		rotationJob = 24
	)
	bearer := newAuthOrigin(t, nil, func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+bearerTok })
	basic := newAuthOrigin(t, nil, func(r *http.Request) bool {
		u, p, ok := r.BasicAuth()
		return ok && u == "mirror" && p == basicPass
	})
	header := newAuthOrigin(t, nil, func(r *http.Request) bool { return r.Header.Get("X-Registry-Key") == headerVal })
	header.throttleFirst.Store(true) // a 429 first: the pacer publishes events, checked for secrets below
	mtls := newAuthOrigin(t, ca, func(r *http.Request) bool {
		return r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == "mirrorworker"
	})
	wrong := newAuthOrigin(t, nil, func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+rightTok })
	// The rotating origin revokes the old token by itself once a third of
	// the rotation jobs are stored (at floor 0 a test's poll could come
	// after the last of them); the new token reaches the file later.
	var rotating *authOrigin
	rotating = newAuthOrigin(t, nil, func(r *http.Request) bool {
		accept := rotOld
		if rotating.ok.Load() >= rotationJob/3 {
			accept = rotNew
		}
		return r.Header.Get("Authorization") == "Bearer "+accept
	})

	dir := t.TempDir()
	cert, key, err := ca.Issue("mirrorworker")
	if err != nil {
		t.Fatal(err)
	}
	writeFile := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeFile("client.crt", cert)
	writeFile("client.key", key)
	writeFile("origin-ca.pem", ca.PEM)
	writeFile("basic.password", []byte(basicPass+"\n"))
	creds := func(wrongOne, rot string) string {
		return `{"authorities": {
			"` + bearer.hostPort() + `": {"bearer": "` + bearerTok + `"},
			"` + basic.hostPort() + `": {"basic": {"username": "mirror", "password_file": "basic.password"}},
			"` + header.hostPort() + `": {"header": {"name": "X-Registry-Key", "value": "` + headerVal + `"}},
			"` + mtls.hostPort() + `": {"client_cert_file": "client.crt", "client_key_file": "client.key", "ca_file": "origin-ca.pem"},
			"` + wrong.hostPort() + `": {"bearer": "` + wrongOne + `"},
			"` + rotating.hostPort() + `": {"bearer": "` + rot + `"}
		}}`
	}
	writeCreds(t, dir, creds(wrongTok, rotOld))

	natsURL := externalNATS(t)
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := workerArgs(natsURL, dataDir, "--credentials", dir, "--credentials-reload", "100ms",
		"--auth-hold", "400ms", "--auth-holds", "2", "--log-level", "debug")
	si, log, done := runInProcess(t, ctx, args...)

	var urls []string
	for _, o := range []*authOrigin{bearer, basic, header, mtls, wrong} {
		for i := range perOrigin {
			urls = append(urls, fmt.Sprintf("%s/obj/%d", o.URL, i))
		}
	}
	enqueueURLs(t, natsURL, urls...)
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	dlqCount := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, jobs.DLQStream)
		if err != nil {
			return -1
		}
		// Records only: a requeue leaves a mark beside each record it
		// requeued (deadletter.IsMark), which is no dead letter.
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			return -1
		}
		n := 0
		for subj, c := range info.State.Subjects {
			if !deadletter.IsMark(subj) {
				n += int(c)
			}
		}
		return n
	}
	waitFor(t, 60*time.Second, "4 origins stored and the wrong one dead-lettered", func() bool {
		return bearer.ok.Load()+basic.ok.Load()+header.ok.Load()+mtls.ok.Load() == 4*perOrigin && dlqCount() == perOrigin
	})
	for _, o := range []*authOrigin{bearer, basic, header, mtls} {
		if o.refused.Load() != 0 {
			t.Errorf("%s refused %d requests with the right credential", o.URL, o.refused.Load())
		}
	}
	// At most DefaultAuthAttempts answers per job, and in fact far fewer:
	// the authority is held, not hammered.
	if n := wrong.refused.Load(); n > perOrigin*3 {
		t.Errorf("the wrong credential was sent %d times for %d jobs: a retry storm", n, perOrigin)
	}
	t.Logf("wrong credential: %d requests for %d jobs", wrong.refused.Load(), perOrigin)
	for _, r := range listJSON(t, natsURL) {
		if r.Record.Reason != "auth_failed" || r.Record.LastStatus != 401 {
			t.Errorf("dead letter %+v, want auth_failed 401", r.Record)
		}
	}
	_, metrics := httpGet(t, si.AdminURL+"/metrics")
	host, port, _ := strings.Cut(wrong.hostPort(), ":")
	if want := fmt.Sprintf(`outcome="auth_failed",port="%s"`, port); !strings.Contains(grepLines(metrics, host), want) {
		t.Errorf("/metrics does not count auth_failed for %s:\n%s", wrong.hostPort(), grepLines(metrics, "upstream_requests_total"))
	}
	if !strings.Contains(metrics, `mirrorworker_dead_letters_total{reason="auth_failed"} 5`) {
		t.Errorf("/metrics lacks 5 auth_failed dead letters:\n%s", grepLines(metrics, "dead_letters"))
	}

	// Rotation: the origin revokes the old token once a third of the jobs
	// are stored; the new one reaches the file a little later.
	var rurls []string
	for i := range rotationJob {
		rurls = append(rurls, fmt.Sprintf("%s/rot/%d", rotating.URL, i))
	}
	enqueueURLs(t, natsURL, rurls...)
	waitFor(t, 60*time.Second, "the origin refusing the old token", func() bool { return rotating.refused.Load() > 0 })
	writeCreds(t, dir, creds(wrongTok, rotNew))
	waitFor(t, 60*time.Second, "every rotation job stored", func() bool { return rotating.ok.Load() == rotationJob })
	if n := dlqCount(); n != perOrigin {
		t.Errorf("%d dead letters after the rotation, want %d (none of the rotation's)", n, perOrigin)
	}
	t.Logf("rotation: %d refused answers before the new token was used", rotating.refused.Load())

	// The fix: the right token in the file, then requeue by reason.
	writeCreds(t, dir, creds(rightTok, rotNew))
	waitFor(t, 30*time.Second, "the fixed file loaded", func() bool { return strings.Count(log.String(), "credentials reloaded") >= 2 })
	out, err := dlqCmd(t, natsURL, "requeue", "--reason", "auth_failed")
	if err != nil {
		t.Fatalf("dlq requeue --reason auth_failed: %v\n%s", err, out)
	}
	waitFor(t, 60*time.Second, "the requeued jobs stored", func() bool { return wrong.ok.Load() == perOrigin })

	// Everything this run wrote.
	_, metrics = httpGet(t, si.AdminURL+"/metrics")
	_, pacerState := httpGet(t, si.AdminURL+"/debug/pacer")
	status, statusErr, _ := runCmd(t, nil, "status", "--nats-url", natsURL, "--json")
	written := map[string]string{
		"json log":      log.String(),
		"metrics":       metrics,
		"/debug/pacer":  pacerState,
		"status":        status + statusErr,
		"MIRROR_DLQ":    streamBytes(t, js, jobs.DLQStream),
		"MIRROR_EVENTS": streamBytes(t, js, jobs.EventsStream),
		"MIRROR_JOBS":   streamBytes(t, js, jobs.JobsStream),
		"attempts":      streamBytes(t, js, "KV_"+jobs.AttemptsBucket),
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop")
	}

	// A second run logs to the console, with a wrong credential again.
	writeCreds(t, dir, creds(wrongTok2, rotNew))
	var console syncBuffer
	cctx, ccancel := context.WithCancel(context.Background())
	cdone := make(chan error, 1)
	go func() {
		cdone <- run(cctx, append([]string{"run"}, append(args, "--log-format", "console", "--worker-id", "console-run")...), noEnv, strings.NewReader(""), io.Discard, &console)
	}()
	enqueueURLs(t, natsURL, wrong.URL+"/again/1", wrong.URL+"/again/2")
	waitFor(t, 60*time.Second, "the second run's dead letters", func() bool { return dlqCount() == perOrigin+2 })
	ccancel()
	if err := <-cdone; err != nil {
		t.Fatalf("console run: %v\n%s", err, console.String())
	}
	written["console log"] = console.String()
	if !strings.Contains(console.String(), "auth_failed") {
		t.Errorf("the console log does not name auth_failed:\n%s", console.String())
	}

	keyLines := strings.Split(strings.TrimSpace(string(key)), "\n")
	secrets := map[string]string{
		"bearer": bearerTok, "basic password": basicPass, "header": headerVal, "wrong token": wrongTok,
		"right token": rightTok, "old token": rotOld, "new token": rotNew, "second wrong token": wrongTok2,
		"basic pair": base64.StdEncoding.EncodeToString([]byte("mirror:" + basicPass)),
		"client key": keyLines[1], // a line of the key's base64
	}
	for where, text := range written {
		if text == "" {
			t.Errorf("%s is empty: the leak check would prove nothing", where)
		}
		for what, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("the %s appears in %s", what, where)
			}
		}
		if strings.Contains(text, "SECRET") {
			t.Errorf("%s holds a secret's bytes:\n%s", where, grepLines(text, "SECRET"))
		}
	}
}
