package fetch_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/fetch"
)

// TestDoAllocatesLittleBeyondNetHTTP holds the fetch path's own
// allocations per request (a GET of 4 KiB over keep-alive, read and
// closed) to a budget over a plain http.Client.Get's, counted in the same
// process beside the same origin (ADR 0036, ninth pass). The budget is
// what the client needs for its checks (the hop's authority, a context
// with a cause, the read watch and the deadline's timer, the Response and
// the body wrapper): a request printed and parsed again, the first hop's
// authority parsed twice more, a User-Agent slice per request, or a timer
// for the minimum rate beside the idle timeout's each exceed it.
func TestDoAllocatesLittleBeyondNetHTTP(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's allocations would be counted; make test runs this plain (FULL_SIZE)")
	}
	const budget = 18
	url, size := fourKiBOrigin(t)
	buf := make([]byte, 32<<10)
	read := func(b io.ReadCloser) {
		n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{b}, buf)
		if err != nil || n != int64(size) {
			t.Fatalf("read %d bytes: %v", n, err)
		}
		b.Close()
	}

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	raw := testing.AllocsPerRun(200, func() {
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		read(resp.Body)
	})

	c := fetch.New(&fetch.Options{AllowPrivate: true})
	defer c.CloseIdleConnections()
	ours := testing.AllocsPerRun(200, func() {
		resp, err := c.Do(context.Background(), fetch.Request{URL: url}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Body == nil {
			t.Fatalf("status %d", resp.Status)
		}
		read(resp.Body)
	})
	t.Logf("allocations per request: net/http %v, fetch %v (+%v)", raw, ours, ours-raw)
	if ours-raw > budget {
		t.Errorf("fetch allocates %v per request beyond net/http's %v, budget %d", ours-raw, raw, budget)
	}
}

// fourKiBOrigin serves issue 40's 4 KiB body at the URL it returns, for
// the allocation budget and BenchmarkRequestCost, until tb ends.
func fourKiBOrigin(tb testing.TB) (url string, size int) {
	payload := strings.Repeat("x", 4<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, payload)
	}))
	tb.Cleanup(srv.Close)
	return srv.URL + "/o", len(payload)
}
