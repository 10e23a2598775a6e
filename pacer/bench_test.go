package pacer_test

import (
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// spacing is the default spacing: the 1 s floor plus the 25 ms start guard.
const spacing = time.Second + pacer.MaxStartGuard

// BenchmarkAcquireDoneHot is decide+report for one authority taking a
// request every spacing on a virtual clock.
func BenchmarkAcquireDoneHot(b *testing.B) {
	p := pacer.New(nil)
	ok := pacer.Response{Status: 200}
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pm, err := p.Acquire(now, host, 0)
		if err != nil {
			b.Fatal(err)
		}
		p.Done(now, pm, ok)
		now = now.Add(spacing)
	}
}

// BenchmarkAcquireConfirmDoneHot is the worker's full path: decide, confirm
// at the start, report.
func BenchmarkAcquireConfirmDoneHot(b *testing.B) {
	p := pacer.New(nil)
	ok := pacer.Response{Status: 200}
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pm, err := p.Acquire(now, host, 0)
		if err != nil {
			b.Fatal(err)
		}
		if pm, err = p.Confirm(now, pm); err != nil || pm.Start.After(now) {
			b.Fatal(pm, err)
		}
		p.Done(now, pm, ok)
		now = now.Add(spacing)
	}
}

// BenchmarkAcquireDoneHotHeaders is the same with a typical response header
// set (rate-limit fields present, not exhausted).
func BenchmarkAcquireDoneHotHeaders(b *testing.B) {
	p := pacer.New(nil)
	ok := pacer.Response{Status: 200, Header: hdr("Content-Type", "application/octet-stream", "Etag", `"abc"`,
		"X-RateLimit-Remaining", "4999", "X-RateLimit-Reset", "1767323045", "RateLimit", `"default";r=50;t=30`)}
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pm, err := p.Acquire(now, host, 0)
		if err != nil {
			b.Fatal(err)
		}
		p.Done(now, pm, ok)
		now = now.Add(spacing)
	}
}

// BenchmarkAcquireDoneHotParallel: many goroutines on one authority with
// floor 0 (the lock is the cost).
func BenchmarkAcquireDoneHotParallel(b *testing.B) {
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 1 << 16}}})
	ok := pacer.Response{Status: 200}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			pm, err := p.Acquire(t0, host, 0)
			if err != nil {
				b.Error(err)
				return
			}
			p.Done(t0, pm, ok)
		}
	})
}

// BenchmarkAcquireConfirmSentDoneParallel is the worker's full path at
// floor 0 (Options.AwaitSends, as the pipeline's pacer): decide, confirm,
// report the write, report the response, from many goroutines on one
// authority. Beside BenchmarkAcquireDoneHotParallel it is the cost of
// Confirm and Sent.
func BenchmarkAcquireConfirmSentDoneParallel(b *testing.B) {
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 1 << 16}}, AwaitSends: true})
	ok := pacer.Response{Status: 200}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			pm, err := p.Acquire(t0, host, 0)
			if err == nil {
				pm, err = p.Confirm(t0, pm)
			}
			if err != nil || pm.Start.After(t0) {
				b.Error(pm, err)
				return
			}
			p.Sent(t0, pm)
			p.Done(t0, pm, ok)
		}
	})
}

const million = 1_000_000

var (
	millionOnce  sync.Once
	millionAuths []string
	millionP     *pacer.Pacer
	millionNow   time.Time
	millionI     int
)

func millionSetup() {
	millionAuths = make([]string, million)
	for i := range millionAuths {
		millionAuths[i] = "h" + strconv.Itoa(i) + ".example.org:443"
	}
	millionP = pacer.New(nil)
	millionNow = t0
	ok := pacer.Response{Status: 200}
	for _, a := range millionAuths {
		pm, _ := millionP.Acquire(millionNow, a, 0)
		millionP.Done(millionNow, pm, ok)
	}
	millionNow = millionNow.Add(spacing)
}

// BenchmarkAcquireDoneMillion is decide+report across 1,000,000 tracked
// authorities, each asked in turn once per spacing (floor and guard).
func BenchmarkAcquireDoneMillion(b *testing.B) {
	millionOnce.Do(millionSetup)
	p, auths := millionP, millionAuths
	ok := pacer.Response{Status: 200}
	step := spacing / million
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pm, err := p.Acquire(millionNow, auths[millionI%million], 0)
		millionI++
		if err != nil {
			b.Fatal(err)
		}
		p.Done(millionNow, pm, ok)
		millionNow = millionNow.Add(step)
	}
	b.StopTimer()
	if n := len(p.Snapshot(millionNow)); n != million {
		b.Fatalf("%d authorities tracked, want %d", n, million)
	}
}

// BenchmarkBytesPerAuthority reports the heap held per tracked authority
// (map slot, entry and the key's copy), measured over up to 1,000,000 new
// authorities; ns/op is the cost of a first request to a new authority.
func BenchmarkBytesPerAuthority(b *testing.B) {
	n := min(b.N, million)
	auths := make([]string, n)
	for i := range auths {
		auths[i] = "h" + strconv.Itoa(i) + ".example.org:443"
	}
	ok := pacer.Response{Status: 200}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p := pacer.New(nil)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pm, _ := p.Acquire(t0, auths[i%n], 0)
		p.Done(t0, pm, ok)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "bytes/authority")
	runtime.KeepAlive(p)
	runtime.KeepAlive(auths)
}
