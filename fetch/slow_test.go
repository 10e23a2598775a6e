package fetch_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
)

func TestMinRateCutsATrickle(t *testing.T) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) }) // runs before the server closes
	o := newOrigin(t, fetchtest.Trickle(20*time.Millisecond, stop))
	// Every read makes progress well within the idle timeout: only the
	// minimum rate can end this fetch.
	c := fetch.New(private(&fetch.Options{IdleTimeout: time.Minute, MinRate: 1 << 10, MinRateWindow: 200 * time.Millisecond}))
	g := &gateLog{}
	resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/slow"}, g.gate)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, fetch.ErrTooSlow) || fetch.ReasonCode(err, 0) != "too_slow" || fetch.IsPermanent(err) {
		t.Fatalf("read %d bytes, err %v (%s); want ErrTooSlow, too_slow, transient", len(got), err, fetch.ReasonCode(err, 0))
	}
	if !strings.Contains(err.Error(), "minimum 1024 B/s") {
		t.Errorf("error %q does not name the minimum rate", err)
	}
	if len(g.done) != 1 || !errors.Is(g.done[0].Err, fetch.ErrTooSlow) {
		t.Errorf("done: %+v; want the hop reported with ErrTooSlow", g.done)
	}
}

func TestTotalDeadlineGrowsWithSize(t *testing.T) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	o := newOrigin(t, fetchtest.Trickle(5*time.Millisecond, stop))
	// No minimum rate: the total deadline alone (100 ms + 1 MB at 1 GB/s)
	// ends the transfer.
	c := fetch.New(private(&fetch.Options{MinRate: -1, DeadlineBase: 100 * time.Millisecond, DeadlineRate: 1 << 30}))
	resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/slow"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, fetch.ErrTooSlow) || !strings.Contains(err.Error(), "total deadline") {
		t.Fatalf("err %v; want ErrTooSlow past the total deadline", err)
	}
}

func TestMinRateSparesAFastBody(t *testing.T) {
	payload := strings.Repeat("z", 256<<10)
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/length" {
			w.Header().Set("Content-Length", strconv.Itoa(len(payload)))
		}
		io.WriteString(w, payload)
	})
	c := fetch.New(private(&fetch.Options{MinRate: 1 << 10, MinRateWindow: time.Second, DeadlineBase: time.Minute}))
	for _, path := range []string{"/length", "/chunked"} {
		resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL + path}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || len(got) != len(payload) {
			t.Errorf("%s: %d bytes, %v", path, len(got), err)
		}
	}
}

// countReader counts what its caller read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func TestExpectedSize(t *testing.T) {
	const big = 50 << 20
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if r.URL.Query().Get("length") == "1" {
			w.Header().Set("Content-Length", strconv.Itoa(n))
		}
		chunk := []byte(strings.Repeat("b", 32<<10))
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return // the client stopped reading
			}
			n -= k
		}
	})
	c := fetch.New(private(nil))
	tests := []struct {
		name    string
		n       int
		length  bool
		doErr   bool // ErrSizeMismatch from Do, before any body byte
		readErr bool // ErrSizeMismatch from reading the body
	}{
		{name: "content-length larger", n: big, length: true, doErr: true},
		{name: "content-length smaller", n: 5, length: true, doErr: true},
		{name: "chunked larger", n: big, readErr: true},
		{name: "content-length equal", n: 10, length: true},
		{name: "chunked equal", n: 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := o.URL + "/obj?n=" + strconv.Itoa(tc.n)
			if tc.length {
				u += "&length=1"
			}
			g := &gateLog{}
			resp, err := c.Do(context.Background(), fetch.Request{URL: u, Size: 10, HasSize: true}, g.gate)
			if tc.doErr {
				if !errors.Is(err, fetch.ErrSizeMismatch) || fetch.ReasonCode(err, 0) != "size_mismatch" {
					t.Fatalf("Do: %v; want ErrSizeMismatch", err)
				}
				if len(g.done) != 1 || g.done[0].Status != 200 || g.done[0].Err != nil {
					t.Errorf("done: %+v; the origin answered, without an error of its own", g.done)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cr := &countReader{r: resp.Body}
			got, err := io.ReadAll(cr)
			resp.Body.Close()
			if tc.readErr {
				if !errors.Is(err, fetch.ErrSizeMismatch) {
					t.Fatalf("read: %v; want ErrSizeMismatch", err)
				}
				// The bound is size + 64 KiB; the reader stops at size + 1.
				if cr.n > 10+64<<10 || len(got) > 10 {
					t.Errorf("read %d bytes (%d returned) of a body over the expected 10", cr.n, len(got))
				}
				return
			}
			if err != nil || len(got) != 10 {
				t.Errorf("%d bytes, %v", len(got), err)
			}
		})
	}
}
