package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mirrorworker/mirrorworker/admin"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
)

func get(t *testing.T, h http.Handler, path string) (int, http.Header, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Header(), rec.Body.String()
}

func TestHealthzAndReadyz(t *testing.T) {
	var readyErr error = errors.New("consumer not bound")
	h := admin.New(&admin.Options{Ready: func() error { return readyErr }})

	tests := []struct {
		name     string
		path     string
		ready    error
		wantCode int
		wantBody string
	}{
		{name: "healthz while not ready", path: "/healthz", ready: errors.New("x"), wantCode: 200, wantBody: "ok"},
		{name: "readyz not ready says why", path: "/readyz", ready: errors.New("consumer not bound"), wantCode: 503, wantBody: "consumer not bound"},
		{name: "readyz ready", path: "/readyz", ready: nil, wantCode: 200, wantBody: "ready"},
		{name: "healthz when ready", path: "/healthz", ready: nil, wantCode: 200, wantBody: "ok"},
		{name: "unknown path", path: "/nope", ready: nil, wantCode: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			readyErr = tt.ready
			code, _, body := get(t, h, tt.path)
			if code != tt.wantCode {
				t.Fatalf("GET %s = %d, want %d (body %q)", tt.path, code, tt.wantCode, body)
			}
			if !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET %s body %q, want it to contain %q", tt.path, body, tt.wantBody)
			}
		})
	}
}

func TestNilOptions(t *testing.T) {
	h := admin.New(nil)
	if code, _, _ := get(t, h, "/healthz"); code != 200 {
		t.Errorf("healthz = %d, want 200", code)
	}
	if code, _, _ := get(t, h, "/readyz"); code != 503 {
		t.Errorf("readyz without a readiness func = %d, want 503", code)
	}
	code, _, body := get(t, h, "/debug/pacer")
	if code != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("debug/pacer = %d %q, want 200 []", code, body)
	}
	if code, _, _ := get(t, h, "/metrics"); code != 200 {
		t.Errorf("metrics = %d, want 200", code)
	}
}

func TestMetricsServesInjectedGatherer(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mirrorworker_jobs_total", Help: "jobs"}, []string{"outcome"})
	reg.MustRegister(c)
	c.WithLabelValues("stored").Add(3)

	code, _, body := get(t, admin.New(&admin.Options{Gatherer: reg}), "/metrics")
	if code != 200 {
		t.Fatalf("metrics = %d", code)
	}
	if !strings.Contains(body, `mirrorworker_jobs_total{outcome="stored"} 3`) {
		t.Errorf("metrics body lacks the counter:\n%s", body)
	}
	if strings.Contains(body, "go_goroutines") {
		t.Errorf("metrics served something other than the injected registry")
	}
}

func TestDebugPacer(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	states := []pacer.State{
		{Authority: "a.example:443", State: "cooling", Floor: time.Second, Interval: 4 * time.Second, CooldownUntil: t0.Add(time.Minute), InFlight: 0, MaxInFlight: 2},
		{Authority: "b.example:80", State: "probing", Floor: 0, Interval: time.Second, Probing: true, InFlight: 1, MaxInFlight: 2},
	}
	h := admin.New(&admin.Options{Pacer: func() []pacer.State { return states }})
	code, hdr, body := get(t, h, "/debug/pacer")
	if code != 200 {
		t.Fatalf("debug/pacer = %d", code)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, body)
	}
	if len(got) != 2 {
		t.Fatalf("got %d objects, want 2", len(got))
	}
	for _, k := range []string{"authority", "floor", "interval", "fallback_ceiling", "cooldown_until", "probing", "in_flight"} {
		if _, ok := got[0][k]; !ok {
			t.Errorf("object lacks %q: %v", k, got[0])
		}
	}
	// Durations as people write them, not nanoseconds (issue 36 item 7).
	if got[0]["floor"] != "1s" || got[0]["interval"] != "4s" || got[1]["floor"] != "0s" || got[0]["floor_ns"] != nil {
		t.Errorf("durations: %s", body)
	}
	if !strings.Contains(body, `"authority": "a.example:443",
    "state": "cooling",
    "floor": "1s",`) {
		t.Errorf("the fields are not in their order:\n%s", body)
	}
	if got[0]["cooldown_until"] != "2026-01-02T03:05:05Z" || got[1]["probing"] != true || got[1]["in_flight"] != float64(1) {
		t.Errorf("unexpected values: %s", body)
	}
}

func TestServerBindsEarlyAndStopsOnCancel(t *testing.T) {
	s, err := admin.Listen("127.0.0.1:0", admin.New(nil))
	if err != nil {
		t.Fatal(err)
	}
	// A second bind on the same port must fail at Listen, before anything runs.
	if s2, err := admin.Listen(s.Addr().String(), admin.New(nil)); err == nil {
		s2.Close()
		t.Fatalf("second Listen on %s succeeded, want address in use", s.Addr())
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	resp, err := http.Get(s.URL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "ok" {
		t.Fatalf("healthz = %d %q", resp.StatusCode, b)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := http.Get(s.URL() + "/healthz"); err == nil {
		t.Error("server still answers after Run returned")
	}
}

func Example() {
	reg := prometheus.NewRegistry()
	h := admin.New(&admin.Options{
		Gatherer: reg,
		Ready:    func() error { return nil },
		Pacer:    func() []pacer.State { return nil },
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	fmt.Println(rec.Code, strings.TrimSpace(rec.Body.String()))
	// Output: 200 ready
}

// TestDebugPacerFetches: each fetch in flight is shown in its authority's
// row, one for an authority the snapshot lacks gets a row of its own.
func TestDebugPacerFetches(t *testing.T) {
	states := []pacer.State{{Authority: "a.example:443", State: "active", InFlight: 1, MaxInFlight: 2}}
	fetches := map[string][]fetch.Progress{
		"a.example:443": {{URL: "https://a.example/big.iso", Authority: "a.example:443", Bytes: 100, Expected: 1000, Rate: 50, Elapsed: 2}},
		"b.example:80":  {{URL: "http://b.example/x", Authority: "b.example:80", Bytes: 7, Expected: -1}},
	}
	h := admin.New(&admin.Options{Pacer: func() []pacer.State { return states }, Fetches: func() map[string][]fetch.Progress { return fetches }})
	_, _, body := get(t, h, "/debug/pacer")
	var got []struct {
		Authority string           `json:"authority"`
		Fetches   []fetch.Progress `json:"fetches"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, body)
	}
	if len(got) != 2 || got[0].Authority != "a.example:443" || len(got[0].Fetches) != 1 || got[0].Fetches[0].Bytes != 100 ||
		got[0].Fetches[0].Expected != 1000 || got[1].Authority != "b.example:80" || len(got[1].Fetches) != 1 {
		t.Errorf("/debug/pacer with fetches:\n%s", body)
	}
}
