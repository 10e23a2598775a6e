package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// stepOrigin streams one large body in steps: each value sent on step
// lets it write that many more bytes; it holds the rest until then.
type stepOrigin struct {
	srv  *httptest.Server
	size int
	step chan int
	sent atomic.Int64
}

func newStepOrigin(t *testing.T, size int) *stepOrigin {
	t.Helper()
	o := &stepOrigin{size: size, step: make(chan int)}
	o.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(http.StatusOK)
		chunk := bytes.Repeat([]byte("s"), 32<<10)
		for left := size; left > 0; {
			var n int
			select {
			case n = <-o.step:
			case <-r.Context().Done():
				return
			}
			for n > 0 && left > 0 {
				k := min(n, left, len(chunk))
				if _, err := w.Write(chunk[:k]); err != nil {
					return
				}
				n, left = n-k, left-k
				o.sent.Add(int64(k))
			}
			w.(http.Flusher).Flush()
		}
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.srv.Listener = ln
	o.srv.Start()
	t.Cleanup(o.srv.Close)
	return o
}

// metricValue is the value of an unlabelled series in a /metrics page; -1
// when absent.
func metricValue(page, name string) float64 {
	sc := bufio.NewScanner(strings.NewReader(page))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// TestProcessStatusShowsLongFetch: while a real origin streams a large body
// in steps, `mirrorworker status` shows the fetch with its bytes so far of
// the Content-Length, growing from step to step; /debug/pacer shows it in
// its authority's row; fetched_bytes_total grows before the body ends.
func TestProcessStatusShowsLongFetch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker")
	}
	t.Parallel()
	const size = 64 << 20
	origin := newStepOrigin(t, size)
	natsURL := externalNATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	si, log, done := runInProcess(t, ctx, workerArgs(natsURL, t.TempDir(), "--target", t.TempDir(), "--worker-id", "long-fetch", "--log-level", "info")...)
	url := origin.srv.URL + "/images/big.iso"
	enqueueLines(t, natsURL, []string{fmt.Sprintf(`{"url":%q,"target":"images/big.iso"}`, url)})

	status := func() string {
		var o bytes.Buffer
		sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer scancel()
		_ = run(sctx, []string{"status", "--nats-url", natsURL}, noEnv, nil, &o, &o)
		return o.String()
	}
	var out string
	for i, want := range []string{"8.0 MiB of 64.0 MiB (12%)", "24.0 MiB of 64.0 MiB (37%)"} {
		origin.step <- []int{8 << 20, 16 << 20}[i]
		waitFor(t, 30*time.Second, "status showing "+want, func() bool {
			out = status()
			return strings.Contains(out, want)
		})
		if !strings.Contains(out, url) || !strings.Contains(out, "FETCHING") {
			t.Errorf("status lacks the fetch's URL:\n%s", out)
		}
		_, page := httpGet(t, si.AdminURL+"/metrics")
		if got := metricValue(page, "mirrorworker_fetched_bytes_total"); got < float64(origin.sent.Load()) || got >= size {
			t.Errorf("fetched_bytes_total %v with %d of %d bytes sent, want them counted before the body ends", got, origin.sent.Load(), size)
		}
	}
	t.Logf("status during the fetch:\n%s", out)
	if _, body := httpGet(t, si.AdminURL+"/debug/pacer"); !strings.Contains(body, `"fetches"`) || !strings.Contains(body, `"expected_bytes": 67108864`) {
		t.Errorf("/debug/pacer lacks the fetch:\n%s", body)
	}
	origin.step <- size
	waitFor(t, 60*time.Second, "the fetch gone from status", func() bool {
		return !strings.Contains(status(), "FETCHING")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, log)
	}
}
