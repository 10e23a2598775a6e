package mirror_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/mirror"
)

// largeObjectEnv sets BenchmarkLargeObject's object size in MiB.
const largeObjectEnv = "MW_BENCH_LARGE_MIB"

// BenchmarkLargeObject stores one large object from a loopback origin two
// ways in each iteration, one after the other, and reports both rates and
// their ratio:
//
//   - raw: what the machine can do with no project code: net/http GET,
//     io.Copy through sha256 into a file, fsync;
//   - project: fetch.Client.Do and FileTarget.Put, as the worker stores a
//     job with a known size and digest.
//
// The size is 128 MiB, or MW_BENCH_LARGE_MIB. The origin serves the bytes
// from memory, in the same process, for both. Run it with -benchtime=3x
// for three interleaved rounds:
//
//	MW_BENCH_LARGE_MIB=512 go test -run '^$' -bench LargeObject -benchtime 3x ./mirror/
func BenchmarkLargeObject(b *testing.B) {
	mib := 128
	if s := os.Getenv(largeObjectEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: want a size in MiB, e.g. 512", largeObjectEnv, s)
		}
		mib = n
	}
	data := make([]byte, mib<<20)
	rng := rand.NewChaCha8([32]byte{1})
	rng.Read(data)
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "obj", time.Time{}, bytes.NewReader(data))
	}))
	defer origin.Close()
	url := origin.URL + "/obj"
	dir := b.TempDir()
	ft, err := mirror.Open(filepath.Join(dir, "mirror"))
	if err != nil {
		b.Fatal(err)
	}
	client := fetch.New(&fetch.Options{AllowPrivate: true})
	defer client.CloseIdleConnections()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	ctx := context.Background()

	var rawTime, projTime time.Duration
	b.SetBytes(2 * int64(len(data)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		// Alternate which goes first, so neither always meets the other's
		// writeback.
		for j := range 2 {
			t0 := time.Now()
			if (i+j)%2 == 0 {
				rawFetch(b, hc, url, filepath.Join(dir, "raw"), digest)
				rawTime += time.Since(t0)
			} else {
				projectFetch(b, ctx, client, ft, url, digest, int64(len(data)))
				projTime += time.Since(t0)
			}
		}
	}
	rate := func(d time.Duration) float64 { return float64(b.N) * float64(mib) / d.Seconds() }
	b.ReportMetric(rate(rawTime), "raw-MiB/s")
	b.ReportMetric(rate(projTime), "project-MiB/s")
	b.ReportMetric(rate(projTime)/rate(rawTime), "project/raw")
}

func rawFetch(b *testing.B, hc *http.Client, url, path, digest string) {
	resp, err := hc.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), resp.Body); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	if hex.EncodeToString(h.Sum(nil)) != digest {
		b.Fatal("raw: wrong digest")
	}
	if err := os.Remove(path); err != nil {
		b.Fatal(err)
	}
}

func projectFetch(b *testing.B, ctx context.Context, c *fetch.Client, ft *mirror.FileTarget, url, digest string, size int64) {
	gate := func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
		return func(fetch.Result) {}, nil
	}
	resp, err := c.Do(ctx, fetch.Request{URL: url, Size: size, HasSize: true}, gate)
	if err != nil {
		b.Fatal(err)
	}
	_, err = ft.Put(ctx, "127.0.0.1/large", resp.Body, mirror.Expect{SHA256: digest, Size: size, HasSize: true},
		mirror.Meta{URL: url, ETag: resp.Header.Get("ETag"), JobID: "bench"})
	resp.Body.Close()
	if err != nil {
		b.Fatal(err)
	}
}
