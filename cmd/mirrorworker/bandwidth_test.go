package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/bandwidth"
)

// byteOrigin serves bodies of size bytes and times every write of its
// handlers: what the origin sent, when. Its sockets' send buffers are
// small (sendBuf) so that a write returns once its bytes are on their way
// to the client, not parked in the origin's kernel: the origin's own
// buffer is not the wire.
type byteOrigin struct {
	size int
	srv  *httptest.Server

	mu     sync.Mutex
	writes []byteWrite
}

type byteWrite struct {
	at time.Time
	n  int
}

const sendBuf = 32 << 10

func newByteOrigin(t *testing.T, size int) *byteOrigin {
	o := &byteOrigin{size: size}
	chunk := bytes.Repeat([]byte("m"), 32<<10)
	o.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for left := size; left > 0; {
			n, err := w.Write(chunk[:min(left, len(chunk))])
			o.mu.Lock()
			o.writes = append(o.writes, byteWrite{time.Now(), n})
			o.mu.Unlock()
			if err != nil {
				return
			}
			left -= n
		}
	}))
	o.srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetWriteBuffer(sendBuf)
		}
		return ctx
	}
	o.srv.Start()
	t.Cleanup(o.srv.Close)
	return o
}

func (o *byteOrigin) auth() string { return strings.TrimPrefix(o.srv.URL, "http://") }

func (o *byteOrigin) sent() (n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, w := range o.writes {
		n += w.n
	}
	return n
}

// firstWrite is when the origin first sent bytes (now if not yet).
func (o *byteOrigin) firstWrite() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.writes) == 0 {
		return time.Now()
	}
	return o.writes[0].at
}

// sentBefore is the bytes the origin sent before at.
func (o *byteOrigin) sentBefore(at time.Time) (n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, w := range o.writes {
		if w.at.Before(at) {
			n += w.n
		}
	}
	return n
}

// maxOver is the most bytes the origin sent in any window of d that starts
// at a write at or after from and ends by until.
func (o *byteOrigin) maxOver(d time.Duration, from, until time.Time) (best int, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ws := o.writes
	for i, w := range ws {
		if w.at.Before(from) || w.at.Add(d).After(until) {
			continue
		}
		sum := 0
		for _, x := range ws[i:] {
			if !x.at.Before(w.at.Add(d)) {
				break
			}
			sum += x.n
		}
		if sum > best {
			best, at = sum, w.at
		}
	}
	return best, at
}

// receiveBuffer is the kernel's initial receive buffer of a TCP socket
// (the middle of net.ipv4.tcp_rmem): what a connection can take in before
// its reader reads anything, and so what the origin can send ahead of any
// cap, once per connection.
func receiveBuffer(t *testing.T) int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 3 {
			if n, err := strconv.Atoi(f[1]); err == nil {
				return n
			}
		}
	}
	t.Logf("tcp_rmem not readable (%v): assuming Linux's default of 128 KiB", err)
	return 128 << 10
}

// TestProcessBandwidthCap is issue 28's bandwidth test: one `run` process,
// one origin on loopback serving 4 MiB bodies, three jobs fetched at once
// (concurrency 4, 3 in flight), the authority capped at 1 MiB/s with
// `policy set --bandwidth` before the pod starts. As the origin measures
// it, no 5 s window carries more than the cap's 5 MiB plus one read's
// worth (the bucket's burst) plus, once for each connection, what TCP
// takes in ahead of the reads (the client's receive buffer, the origin's
// send buffer, the two HTTP buffers: about 160 KiB each here). Two thirds in, `policy set`
// raises the cap to 8 MiB/s: within a second the origin sends faster than
// the old cap allows. status shows the cap; the metrics count the bytes
// and the time throttled.
func TestProcessBandwidthCap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a worker process")
	}
	const (
		size    = 4 << 20
		jobsN   = 3
		capRate = 1 << 20
		raised  = 8 << 20
		window  = 5 * time.Second
		reach   = time.Second // a policy change reaches the pod within this
	)
	natsURL := externalNATS(t)
	origin := newByteOrigin(t, size)
	auth := origin.auth()
	if out, err := runPolicy(t, natsURL, "set", "--authority", auth, "--bandwidth", "1MiB/s", "--reason", "test: cap"); err != nil {
		t.Fatalf("policy set: %v\n%s", err, out)
	}
	targets := map[string]string{}
	var urls []string
	for i := range jobsN {
		u := fmt.Sprintf("%s/big/%d", origin.srv.URL, i)
		targets[u], urls = fmt.Sprintf("big/%d", i), append(urls, u)
	}
	publishURLs(t, natsURL, targets, urls)
	root := t.TempDir()
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", root, "--concurrency", "4",
		"--max-in-flight", "3", "--lease-ttl", "2s", "--log-level", "info")...)

	// status shows the cap in force on the pod that serves the authority.
	waitFor(t, 30*time.Second, "status showing the bandwidth cap", func() bool {
		var o bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = run(ctx, []string{"status", "--nats-url", natsURL, "--authority", auth}, noEnv, nil, &o, &o)
		return strings.Contains(o.String(), "1MiB/s")
	})
	// Raised two thirds in, and not before one whole window at the cap.
	waitFor(t, 60*time.Second, "two thirds of the bytes at the cap", func() bool {
		return origin.sent() >= 2*jobsN*size/3 && time.Since(origin.firstWrite()) > window+200*time.Millisecond
	})
	if out, err := runPolicy(t, natsURL, "set", "--authority", auth, "--bandwidth", "8MiB/s", "--reason", "test: raise"); err != nil {
		t.Fatalf("policy set: %v\n%s", err, out)
	}
	raisedAt := time.Now()
	waitFor(t, 60*time.Second, "every body stored", func() bool {
		files := mirrorFiles(t, root)
		for _, key := range targets {
			if len(files[key]) != size {
				return false
			}
		}
		return true
	})
	_, metrics := httpGet(t, pod.start.AdminURL+"/metrics")
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}

	origin.mu.Lock()
	last := origin.writes[len(origin.writes)-1].at
	origin.mu.Unlock()
	first := origin.firstWrite()
	// What one connection holds between the origin's writes and the
	// worker's reads: the receive buffer (twice the initial one: the
	// kernel grows it by autotuning when its reader takes a burst at
	// once), the send buffer (the kernel doubles SO_SNDBUF), net/http's
	// buffers on both sides.
	perConn := 2*receiveBuffer(t) + 2*sendBuf + 2*4096
	slack := bandwidth.Burst(capRate) + jobsN*perConn
	limit := int(window.Seconds()*capRate) + slack
	// Windows that end before the raise could reach the pod.
	got, at := origin.maxOver(window, first, raisedAt)
	t.Logf("at the 1 MiB/s cap: at most %d bytes (%.2f MiB) in a %s window (from +%.2fs), limit %d (cap %d + slack %d); raised at +%.2fs, last byte at +%.2fs",
		got, float64(got)/(1<<20), window, at.Sub(first).Seconds(), limit, int(window.Seconds()*capRate), slack,
		raisedAt.Sub(first).Seconds(), last.Sub(first).Seconds())
	if steady, sat := origin.maxOver(window, first.Add(time.Second), raisedAt); steady > 0 {
		t.Logf("windows from +1s on (the connections' buffers full): at most %d bytes (%.2f MiB, from +%.2fs), the cap allows %d plus one burst %d",
			steady, float64(steady)/(1<<20), sat.Sub(first).Seconds(), int(window.Seconds()*capRate), bandwidth.Burst(capRate))
	}
	if got == 0 {
		t.Fatalf("no %s window ended before the raise: the transfer was faster than the cap (first byte +0, raise at +%.2fs)", window, raisedAt.Sub(first).Seconds())
	}
	if got > limit {
		t.Errorf("the origin sent %d bytes in %s from +%.2fs at a cap of 1 MiB/s, above %d", got, window, at.Sub(first).Seconds(), limit)
	}
	// Raised: the bytes sent after the change came faster than the old cap
	// allows them (less the one burst and the buffers it could have
	// filled ahead), so the pod took the new cap within reach.
	after := jobsN*size - origin.sentBefore(raisedAt)
	oldNeeds := time.Duration(float64(after-slack) / capRate * float64(time.Second))
	t.Logf("after the raise to 8 MiB/s: %d bytes in %v; the old cap needs at least %v for them", after, last.Sub(raisedAt).Round(time.Millisecond), oldNeeds.Round(time.Millisecond))
	if took := last.Sub(raisedAt); took >= oldNeeds {
		t.Errorf("the %d bytes after the raise took %v, no faster than the old cap allows (%v)", after, took, oldNeeds)
	}
	for _, name := range []string{"mirrorworker_bandwidth_throttled_bytes_total", "mirrorworker_bandwidth_wait_seconds_total"} {
		line := grepLines(metrics, name+`{cap="authority",host="127.0.0.1"`) // not the other authorities' series, 0 from the start
		if line == "" || strings.HasSuffix(strings.TrimSpace(line), " 0") {
			t.Errorf("metric %s: %q, want a positive count for the authority", name, line)
		}
	}
}
