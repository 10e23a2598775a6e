package replay_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
)

// origin is a loopback HTTP origin serving a deterministic body per path,
// with an ETag, answering If-None-Match with 304. It counts what it gets.
type origin struct {
	srv  *httptest.Server
	auth authority.Authority

	// throttle, if set, may answer a request instead (status and headers);
	// it returns 0 to let the request through.
	throttle func(n int, h http.Header) int

	mu          sync.Mutex
	requests    int
	conditional int // requests with If-None-Match or If-Modified-Since
	notModified int
	times       []time.Time // when each request arrived
}

func newOrigin(t *testing.T) *origin {
	t.Helper()
	o := &origin{}
	o.srv = httptest.NewServer(http.HandlerFunc(o.serve))
	t.Cleanup(o.srv.Close)
	a, err := authority.Parse(o.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	o.auth = a
	return o
}

// objectBody is the content of path: 100 to 4,000 bytes derived from it.
func objectBody(path string) []byte {
	sum := sha256.Sum256([]byte(path))
	n := 100 + (int(sum[0])<<8|int(sum[1]))%3900
	b := make([]byte, 0, n)
	for len(b) < n {
		b = append(b, sum[:]...)
		sum = sha256.Sum256(sum[:])
	}
	return b[:n]
}

func etagOf(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + hex.EncodeToString(sum[:8]) + `"`
}

func (o *origin) serve(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.requests++
	n := o.requests
	o.times = append(o.times, time.Now())
	cond := r.Header.Get("If-None-Match") != "" || r.Header.Get("If-Modified-Since") != ""
	if cond {
		o.conditional++
	}
	throttle := o.throttle
	o.mu.Unlock()

	if throttle != nil {
		if status := throttle(n, w.Header()); status != 0 {
			w.WriteHeader(status)
			return
		}
	}
	body := objectBody(r.URL.Path)
	etag := etagOf(body)
	w.Header().Set("ETag", etag)
	w.Header().Set("Last-Modified", "Sun, 29 Nov 2026 08:00:00 GMT")
	if r.Header.Get("If-None-Match") == etag {
		o.mu.Lock()
		o.notModified++
		o.mu.Unlock()
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// counts returns requests, conditional requests and 304s so far.
func (o *origin) counts() (requests, conditional, notModified int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.requests, o.conditional, o.notModified
}

func (o *origin) requestTimes() []time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Time(nil), o.times...)
}
