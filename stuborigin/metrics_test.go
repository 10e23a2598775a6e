package stuborigin_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// scrape returns what h serves on GET /metrics.
func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

func TestMetricsOnAdminAndInjectedRegisterer(t *testing.T) {
	p := &stuborigin.Profile{
		Name:                "t",
		Quotas:              map[string]stuborigin.Quota{"anonymous": quota(1, 0.5, 100, 100*time.Second)},
		CapacityErrorBudget: 0.05,
	}
	reg := prometheus.NewRegistry()
	og, err := stuborigin.New(p, &stuborigin.Options{Clock: clock.NewFake(t0), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	h := og.Handler(0)
	for range 2 { // admitted, then 429 burst
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil))
	}
	if err := og.SetFaults(stuborigin.Faults{StoreDown: true}); err != nil {
		t.Fatal(err)
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil)) // 503

	want := []string{
		`# TYPE mirrorworker_stub_requests_total counter`,
		`mirrorworker_stub_requests_total{authority="authority-0",caller="anonymous"} 3`,
		`# TYPE mirrorworker_stub_admissions_total counter`,
		`mirrorworker_stub_admissions_total{authority="authority-0",caller="anonymous"} 1`,
		`# TYPE mirrorworker_stub_rejections_total counter`,
		`mirrorworker_stub_rejections_total{authority="authority-0",caller="anonymous",code="rate_limited",reason="burst"} 1`,
		`mirrorworker_stub_rejections_total{authority="authority-0",caller="anonymous",code="capacity_exhausted",reason="limiter_unavailable"} 1`,
		`# TYPE mirrorworker_stub_identities gauge`,
		`mirrorworker_stub_identities{authority="authority-0"} 1`,
		`# TYPE mirrorworker_stub_capacity_error_budget gauge`,
		`mirrorworker_stub_capacity_error_budget 0.05`,
	}
	for name, h := range map[string]http.Handler{
		"admin":    og.AdminHandler(),
		"injected": promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	} {
		m := scrape(t, h)
		for _, line := range want {
			if !strings.Contains(m, line+"\n") {
				t.Errorf("%s: metrics lack %q:\n%s", name, line, m)
			}
		}
	}
}

func TestMetricsRegistererClash(t *testing.T) {
	p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": generous()}}
	reg := prometheus.NewRegistry()
	if _, err := stuborigin.New(p, &stuborigin.Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := stuborigin.New(p, &stuborigin.Options{Registerer: reg}); err == nil {
		t.Error("second origin on one Registerer: no error")
	}

	wrapped := prometheus.NewRegistry()
	for _, name := range []string{"a", "b"} {
		r := prometheus.WrapRegistererWith(prometheus.Labels{"origin": name}, wrapped)
		if _, err := stuborigin.New(p, &stuborigin.Options{Registerer: r}); err != nil {
			t.Errorf("origin %s on a wrapped Registerer: %v", name, err)
		}
	}
}
