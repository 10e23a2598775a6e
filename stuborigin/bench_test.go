package stuborigin_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// benchProfile has n token identities with quotas no benchmark exhausts, so
// every request runs the full admission path and is admitted.
func benchProfile(n int) (*stuborigin.Profile, []string) {
	q := quota(1_000_000, 1_000_000, 1_000_000_000, time.Hour)
	p := &stuborigin.Profile{
		Name:   "bench",
		Quotas: map[string]stuborigin.Quota{"anonymous": q, "default": q},
		Tokens: map[string]stuborigin.Token{},
	}
	auth := make([]string, n)
	for i := range n {
		tok := fmt.Sprintf("bench-%05d", i)
		p.Tokens[tok] = stuborigin.Token{Principal: fmt.Sprintf("p%d", i), Tenant: fmt.Sprintf("t%d", i%100)}
		auth[i] = "Bearer " + tok
	}
	return p, auth
}

// BenchmarkLoopback reports admitted requests per second over real HTTP on
// loopback, for one identity and for 10,000.
func BenchmarkLoopback(b *testing.B) {
	for _, n := range []int{1, 10_000} {
		b.Run(fmt.Sprintf("identities=%d", n), func(b *testing.B) {
			p, auth := benchProfile(n)
			og, err := stuborigin.New(p, nil)
			if err != nil {
				b.Fatal(err)
			}
			urls, err := og.Start(context.Background(), "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer og.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: 4 * runtime.GOMAXPROCS(0)}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			var next atomic.Int64
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("GET", urls[0]+"/bench?size=64", nil)
					req.Header.Set("Authorization", auth[int(next.Add(1))%n])
					resp, err := c.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			b.StopTimer()
			st := og.Stats().Authorities[0]
			if st.Admitted != st.Requests {
				b.Fatalf("%d of %d admitted", st.Admitted, st.Requests)
			}
			b.ReportMetric(float64(st.Admitted)/b.Elapsed().Seconds(), "admitted/s")
			b.ReportMetric(float64(st.IdentityCount), "identities")
		})
	}
}

// BenchmarkAdmission is the handler without the network: the cost of
// identifying, admitting and answering a HEAD.
func BenchmarkAdmission(b *testing.B) {
	for _, n := range []int{1, 10_000} {
		b.Run(fmt.Sprintf("identities=%d", n), func(b *testing.B) {
			p, auth := benchProfile(n)
			og, err := stuborigin.New(p, nil)
			if err != nil {
				b.Fatal(err)
			}
			h := og.Handler(0)
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest("HEAD", "/bench?size=64", nil)
					req.Header.Set("Authorization", auth[int(next.Add(1))%n])
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					if w.Code != 200 {
						b.Errorf("status %d", w.Code)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admitted/s")
		})
	}
}
