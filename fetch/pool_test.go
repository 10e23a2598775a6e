package fetch_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/mirrorworker/mirrorworker/fetch"
)

// TestConnectionsReusedAcrossManyAuthorities cycles through more
// authorities than the pool of earlier versions kept (256): every
// connection must still be there when its authority comes round again.
func TestConnectionsReusedAcrossManyAuthorities(t *testing.T) {
	const n = 300
	var conns atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
	}
	t.Cleanup(func() { srv.Close() })
	var urls []string
	for i := range n {
		// One loopback address per authority: 127.77.x.y.
		ln, err := net.Listen("tcp", fmt.Sprintf("127.77.%d.%d:0", 1+i/250, 1+i%250))
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
		urls = append(urls, "http://"+ln.Addr().String()+"/o")
	}
	c := fetch.New(&fetch.Options{AllowPrivate: true})
	t.Cleanup(c.CloseIdleConnections)
	for round := range 3 {
		for _, u := range urls {
			resp, err := c.Do(context.Background(), fetch.Request{URL: u}, nil)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	if got := conns.Load(); got != n {
		t.Errorf("%d connections for %d authorities fetched 3 times each, want %d (one each, reused)", got, n, n)
	}
}
