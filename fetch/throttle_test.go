package fetch_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/bandwidth"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestCappedBodyIsNotTooSlow: a body held to 256 KiB/s by its authority's
// cap is read whole although the client's minimum rate (512 KiB/s) is
// above the cap and its total deadline (200 ms) is shorter than the
// transfer: time waited on the cap is not time spent on the origin. The
// control, an origin that itself sends at that rate, is cut as too slow by
// the same client without a cap.
func TestCappedBodyIsNotTooSlow(t *testing.T) {
	const size, capRate = 192 << 10, 256 << 10
	payload := strings.Repeat("b", size)
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		if r.URL.Path != "/trickle" {
			io.WriteString(w, payload)
			return
		}
		step := bandwidth.Burst(capRate)
		for i := 0; i < size; i += step {
			io.WriteString(w, payload[i:min(i+step, size)])
			w.(http.Flusher).Flush()
			select {
			case <-time.After(time.Duration(float64(step) / capRate * float64(time.Second))):
			case <-r.Context().Done():
				return
			}
		}
	})
	u, _ := url.Parse(o.URL)
	opts := func(th fetch.Throttle) *fetch.Options {
		return private(&fetch.Options{MinRate: 2 * capRate, MinRateWindow: 100 * time.Millisecond,
			DeadlineBase: 200 * time.Millisecond, DeadlineRate: 1 << 30, Throttle: th})
	}
	caps, err := bandwidth.New(&bandwidth.Options{Policy: &pacer.Policy{
		Default:     pacer.Limits{Floor: time.Second, MaxInFlight: 2},
		Authorities: map[string]pacer.Limits{u.Host: {Floor: time.Second, MaxInFlight: 2, Bandwidth: capRate}},
	}})
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	got, err := readAll(fetch.New(opts(caps)), o.URL+"/fast")
	took := time.Since(start)
	if err != nil || len(got) != size {
		t.Fatalf("capped body: %d of %d bytes after %v: %v", len(got), size, took, err)
	}
	// The cap held (the bucket starts with one burst): the transfer outlived
	// the deadline and every rate window.
	if least := time.Duration(float64(size-bandwidth.Burst(capRate)) / capRate * float64(time.Second)); took < least {
		t.Errorf("capped body read in %v, faster than the cap allows (%v)", took, least)
	}

	got, err = readAll(fetch.New(opts(nil)), o.URL+"/trickle")
	if !errors.Is(err, fetch.ErrTooSlow) {
		t.Fatalf("an origin sending at the cap's rate: %d bytes, %v; want ErrTooSlow", len(got), err)
	}
}

func readAll(c *fetch.Client, rawURL string) ([]byte, error) {
	resp, err := c.Do(context.Background(), fetch.Request{URL: rawURL}, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
