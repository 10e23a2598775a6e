package fetch_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"testing"

	"github.com/mirrorworker/mirrorworker/fetch"
)

// BenchmarkRequestCost is the fetch path's cost per request beside a plain
// http.Client.Get, one request at a time over keep-alive to a loopback
// origin answering 4 KiB (issue 40's bodies): the difference is what the
// client's wrappers cost. "traced" adds a trace like the worker's (GotConn,
// WroteRequest arming AfterNextWrite, GotFirstResponseByte). Run as (ADR
// 0036, ninth pass):
//
//	go test -run '^$' -bench BenchmarkRequestCost -benchmem -count 4 ./fetch/
func BenchmarkRequestCost(b *testing.B) {
	url, _ := fourKiBOrigin(b)
	buf := make([]byte, 32<<10)

	b.Run("raw", func(b *testing.B) {
		hc := &http.Client{Transport: &http.Transport{}}
		defer hc.CloseIdleConnections()
		b.ReportAllocs()
		for b.Loop() {
			resp, err := hc.Get(url)
			if err != nil {
				b.Fatal(err)
			}
			io.CopyBuffer(io.Discard, struct{ io.Reader }{resp.Body}, buf)
			resp.Body.Close()
		}
	})
	for _, traced := range []bool{false, true} {
		name := "fetch"
		if traced {
			name = "fetch-traced"
		}
		b.Run(name, func(b *testing.B) {
			c := fetch.New(&fetch.Options{AllowPrivate: true})
			defer c.CloseIdleConnections()
			b.ReportAllocs()
			for b.Loop() {
				ctx := context.Background()
				if traced {
					ctx = httptrace.WithClientTrace(ctx, benchTrace())
				}
				resp, err := c.Do(ctx, fetch.Request{URL: url}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if resp.Body == nil {
					b.Fatalf("status %d", resp.Status)
				}
				io.CopyBuffer(io.Discard, struct{ io.Reader }{resp.Body}, buf)
				resp.Body.Close()
			}
		})
	}
}

// benchTrace is a trace with the worker's hooks (worker/hops.go).
func benchTrace() *httptrace.ClientTrace {
	var disarm func()
	return &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			disarm = fetch.AfterNextWrite(info.Conn, func() {})
		},
		GotFirstResponseByte: func() {
			if disarm != nil {
				disarm()
			}
		},
	}
}
