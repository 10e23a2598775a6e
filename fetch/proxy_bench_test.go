package fetch_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
)

// BenchmarkProxyThroughput compares fetching 16 KiB objects from loopback
// origins directly and through the forward proxy of fetchtest (HTTPS over
// CONNECT, HTTP forwarded), 4 requests per CPU at a time, so that connection reuse
// through the proxy shows as a ratio of the direct figure:
//
//	go test -run '^$' -bench BenchmarkProxyThroughput -benchtime 3s ./fetch/
func BenchmarkProxyThroughput(b *testing.B) {
	ca, err := fetchtest.NewCA()
	if err != nil {
		b.Fatal(err)
	}
	stc, err := ca.ServerTLS(false, "127.0.0.1", "bench.test")
	if err != nil {
		b.Fatal(err)
	}
	payload := strings.Repeat("x", 16<<10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, payload) })
	tlsSrv := httptest.NewUnstartedServer(h)
	tlsSrv.TLS = stc
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	plainSrv := httptest.NewServer(h)
	defer plainSrv.Close()
	px := fetchtest.NewProxy(map[string]string{
		"bench.test:443": tlsSrv.Listener.Addr().String(),
		"bench.test:80":  plainSrv.Listener.Addr().String(),
	}, "")
	defer px.Close()
	res := mapResolver{}
	for _, tc := range []struct {
		name  string
		url   string
		proxy fetch.Proxy
	}{
		{"https/direct", tlsSrv.URL + "/o", fetch.Proxy{}},
		{"https/proxy", "https://bench.test/o", fetch.Proxy{HTTPSProxy: px.URL}},
		{"http/direct", plainSrv.URL + "/o", fetch.Proxy{}},
		{"http/proxy", "http://bench.test/o", fetch.Proxy{HTTPProxy: px.URL}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := fetch.New(&fetch.Options{AllowPrivate: true, Proxy: tc.proxy, Resolver: res,
				TLSConfig: &tls.Config{RootCAs: ca.Pool}, MaxIdleConnsPerHost: 16})
			defer c.CloseIdleConnections()
			b.SetBytes(int64(len(payload)))
			conns0 := px.Conns()
			b.SetParallelism(4) // 4 goroutines per GOMAXPROCS
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.Do(context.Background(), fetch.Request{URL: tc.url}, nil)
					if err != nil {
						b.Error(err)
						return
					}
					if resp.Body == nil {
						b.Error(fmt.Errorf("status %d", resp.Status))
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			if !tc.proxy.IsZero() {
				// Connections to the proxy for the whole run: reuse keeps it
				// near the requests in flight, whatever b.N.
				b.ReportMetric(float64(px.Conns()-conns0), "proxy-conns")
			}
		})
	}
}
