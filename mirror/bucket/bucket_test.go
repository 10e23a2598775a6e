package bucket_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/bucket"
	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, srv *buckettest.Server, spec string, o *bucket.Options) *bucket.Target {
	t.Helper()
	if o == nil {
		o = &bucket.Options{}
	}
	o.Endpoint, o.Region, o.Credentials = srv.Endpoint, buckettest.Region, buckettest.Credentials()
	o.Logger = zerolog.New(zerolog.NewTestWriter(t))
	tg, err := bucket.Open(ctxT(t), spec, o)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func hexSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		spec, bucket, prefix string
		bad                  bool
	}{
		{spec: "s3://mirror", bucket: "mirror"},
		{spec: "s3://mirror/", bucket: "mirror"},
		{spec: "s3://mirror/pypi/", bucket: "mirror", prefix: "pypi/"},
		{spec: "s3://mirror/a/b", bucket: "mirror", prefix: "a/b/"},
		{spec: "s3://Mirror", bad: true},
		{spec: "s3://ab", bad: true},
		{spec: "s3://key:secret@mirror", bad: true},
		{spec: "s3://mirror:9000", bad: true},
		{spec: "s3://mirror/a/../b", bad: true},
		{spec: "s3://mirror/.mirrorworker", bad: true},
		{spec: "s3://mirror?region=x", bad: true},
		{spec: "file:///tmp", bad: true},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			b, p, err := bucket.ParseSpec(tc.spec)
			if tc.bad {
				if err == nil {
					t.Fatalf("ParseSpec(%q) = %q, %q; want an error", tc.spec, b, p)
				}
				return
			}
			if err != nil || b != tc.bucket || p != tc.prefix {
				t.Fatalf("ParseSpec(%q) = %q, %q, %v; want %q, %q", tc.spec, b, p, err, tc.bucket, tc.prefix)
			}
		})
	}
}

// partFiles lists what versitygw keeps of unfinished multipart uploads
// (under <root>/<bucket>/.sgwtmp): empty once none is left.
func pendingUploads(t *testing.T, srv *buckettest.Server, b string) []string {
	t.Helper()
	out, err := srv.Client().ListMultipartUploads(ctxT(t), &s3.ListMultipartUploadsInput{Bucket: &b})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, u := range out.Uploads {
		keys = append(keys, aws.ToString(u.Key))
	}
	return keys
}

func TestPutStatSmallAndLarge(t *testing.T) {
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	tg := open(t, srv, "s3://mirror/pre", &bucket.Options{PartSize: bucket.MinPartSize, PartsInFlight: 2})
	at := time.Date(2026, 12, 1, 10, 0, 0, 123, time.UTC)
	for _, tc := range []struct {
		name    string
		size    int
		withSum bool
	}{
		{"empty", 0, true},
		{"4KiB", 4 << 10, true},
		{"one-part", 3 << 20, false},          // one PutObject from the part buffer
		{"multipart", 13<<20 + 17, true},      // three parts, the last short
		{"multipart-no-sum", 11 << 20, false}, // sha256 kept in a receipt
		{"exact-parts", 10 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			data := randBytes(tc.size, uint64(tc.size))
			want := mirror.Expect{Size: int64(tc.size), HasSize: true}
			if tc.withSum {
				want.SHA256 = hexSum(data)
			}
			key := "objects/" + tc.name + ".bin"
			in := mirror.Meta{URL: "http://user:pw@origin.test/" + tc.name, ETag: `"abc-ü"`, LastModified: "Tue, 01 Dec 2026 09:00:00 GMT",
				ContentType: "application/x-test", JobID: "job-" + tc.name, FetchedAt: at}
			got, err := tg.Put(ctx, key, bytes.NewReader(data), want, in)
			if err != nil {
				t.Fatal(err)
			}
			if got.SHA256 != hexSum(data) || got.Size != int64(tc.size) || got.URL != "http://origin.test/"+tc.name {
				t.Fatalf("Put returned %+v", got)
			}
			// The bytes, as a reader of the bucket sees them.
			obj, err := srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("mirror"), Key: aws.String("pre/" + key)})
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(obj.Body)
			obj.Body.Close()
			if !bytes.Equal(body, data) {
				t.Fatalf("stored %d bytes, not the %d put", len(body), len(data))
			}
			m, err := tg.Stat(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			wantMeta := got
			if m != wantMeta {
				t.Fatalf("Stat = %+v\nwant   %+v", m, wantMeta)
			}
		})
	}
	if p := pendingUploads(t, srv, "mirror"); len(p) != 0 {
		t.Fatalf("uploads left pending: %v", p)
	}
}

func TestMismatchStoresNothing(t *testing.T) {
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	tg := open(t, srv, "s3://mirror", &bucket.Options{PartSize: bucket.MinPartSize})
	for _, tc := range []struct {
		name string
		size int
		want func(data []byte) mirror.Expect
		err  error
	}{
		{"small-digest", 1000, func(d []byte) mirror.Expect { return mirror.Expect{SHA256: hexSum(append([]byte("x"), d...))} }, mirror.ErrDigestMismatch},
		{"small-size", 1000, func(d []byte) mirror.Expect { return mirror.Expect{Size: 999, HasSize: true} }, mirror.ErrSizeMismatch},
		{"large-digest", 12 << 20, func(d []byte) mirror.Expect { return mirror.Expect{SHA256: strings.Repeat("0", 64)} }, mirror.ErrDigestMismatch},
		{"large-size", 12 << 20, func(d []byte) mirror.Expect { return mirror.Expect{Size: 12<<20 + 1, HasSize: true} }, mirror.ErrSizeMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := randBytes(tc.size, 7)
			_, err := tg.Put(ctxT(t), tc.name, bytes.NewReader(data), tc.want(data), mirror.Meta{JobID: "j", FetchedAt: time.Now()})
			if !errors.Is(err, tc.err) {
				t.Fatalf("Put: %v; want %v", err, tc.err)
			}
			if _, err := tg.Stat(ctxT(t), tc.name); !errors.Is(err, mirror.ErrNotFound) {
				t.Fatalf("Stat after a refused Put: %v; want ErrNotFound", err)
			}
		})
	}
	if p := pendingUploads(t, srv, "mirror"); len(p) != 0 {
		t.Fatalf("refused uploads not aborted: %v", p)
	}
}

// failingReader fails after n bytes, as an origin that drops the
// connection mid-body.
type failingReader struct {
	r io.Reader
	n int
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("origin connection reset")
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

func TestReadErrorMidMultipartAborts(t *testing.T) {
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	tg := open(t, srv, "s3://mirror", &bucket.Options{PartSize: bucket.MinPartSize})
	data := randBytes(20<<20, 3)
	_, err := tg.Put(ctxT(t), "broken", &failingReader{r: bytes.NewReader(data), n: 12 << 20}, mirror.Expect{}, mirror.Meta{JobID: "j", FetchedAt: time.Now()})
	if err == nil || mirror.FailureCode(err) != "" {
		t.Fatalf("Put of a body that fails: %v; want a read error, not a target failure", err)
	}
	if _, err := tg.Stat(ctxT(t), "broken"); !errors.Is(err, mirror.ErrNotFound) {
		t.Fatalf("Stat: %v; want ErrNotFound", err)
	}
	if p := pendingUploads(t, srv, "mirror"); len(p) != 0 {
		t.Fatalf("upload not aborted: %v", p)
	}
}

func TestOpenSweepsAbandonedUploads(t *testing.T) {
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	c := srv.Client()
	ctx := ctxT(t)
	for _, k := range []string{"pre/a", "pre/b/c", "other/d"} {
		if _, err := c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String("mirror"), Key: aws.String(k)}); err != nil {
			t.Fatal(err)
		}
	}
	open(t, srv, "s3://mirror/pre", nil)
	if p := pendingUploads(t, srv, "mirror"); len(p) != 1 || p[0] != "other/d" {
		t.Fatalf("after Open of s3://mirror/pre, uploads %v; want only other/d (outside the prefix)", p)
	}
}

func TestStoreFailuresAreUnavailable(t *testing.T) {
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	ctx := ctxT(t)

	// A bucket that does not exist, and credentials the store refuses,
	// fail Open.
	if _, err := bucket.Open(ctx, "s3://nonesuch", &bucket.Options{Endpoint: srv.Endpoint, Credentials: buckettest.Credentials()}); mirror.FailureCode(err) != "unavailable" {
		t.Fatalf("Open of a missing bucket: %v; want ErrUnavailable", err)
	}
	tg := open(t, srv, "s3://mirror", nil)

	// The store goes away: Put, Stat and Probe say unavailable.
	srv.Stop()
	_, err := tg.Put(ctx, "k", strings.NewReader("x"), mirror.Expect{}, mirror.Meta{FetchedAt: time.Now()})
	if mirror.FailureCode(err) != "unavailable" {
		t.Fatalf("Put with the store down: %v; want ErrUnavailable", err)
	}
	if _, err := tg.Stat(ctx, "k"); mirror.FailureCode(err) != "unavailable" {
		t.Fatalf("Stat with the store down: %v; want ErrUnavailable", err)
	}
	if err := tg.Probe(ctx); mirror.FailureCode(err) != "unavailable" {
		t.Fatalf("Probe with the store down: %v; want ErrUnavailable", err)
	}
	srv.Restart()
	if err := tg.Probe(ctx); err != nil {
		t.Fatalf("Probe after restart: %v", err)
	}

	// The bucket removed under the target: NoSuchBucket is the store's.
	if err := os.RemoveAll(filepath.Join(srv.Root, "mirror")); err != nil {
		t.Fatal(err)
	}
	_, err = tg.Put(ctx, "k", strings.NewReader("x"), mirror.Expect{}, mirror.Meta{FetchedAt: time.Now()})
	if mirror.FailureCode(err) != "unavailable" || !strings.Contains(err.Error(), "NoSuchBucket") {
		t.Fatalf("Put into a removed bucket: %v; want ErrUnavailable naming NoSuchBucket", err)
	}
}

// faultProxy stands in front of the real server and answers the next
// writes (PUT, POST) with an S3 error instead of passing them on.
type faultProxy struct {
	*httptest.Server
	mu     sync.Mutex
	status int
	code   string
	left   int // writes still to fail; -1: all
	failed int
	flip   int // writes still to pass on with one byte of the body changed
}

func newFaultProxy(t *testing.T, srv *buckettest.Server) *faultProxy {
	u, err := url.Parse(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &faultProxy{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		fail := (r.Method == http.MethodPut || r.Method == http.MethodPost) && p.left != 0
		if fail {
			p.failed++
			if p.left > 0 {
				p.left--
			}
		}
		status, code := p.status, p.code
		flip := !fail && r.Method == http.MethodPut && p.flip > 0
		if flip {
			p.flip--
		}
		p.mu.Unlock()
		if flip { // damage in transit, behind the signature and the checksum
			body, _ := io.ReadAll(r.Body)
			body[len(body)/2] ^= 1
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		if !fail {
			rp.ServeHTTP(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected</Message></Error>`, code)
	}))
	t.Cleanup(p.Server.Close)
	return p
}

func (p *faultProxy) fail(status int, code string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status, p.code, p.left, p.failed = status, code, n, 0
}

func TestStoreAnswers(t *testing.T) {
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	proxy := newFaultProxy(t, srv)
	tg, err := bucket.Open(ctxT(t), "s3://mirror", &bucket.Options{Endpoint: proxy.URL, Credentials: buckettest.Credentials(),
		MaxWriteSpacing: 200 * time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string) error {
		_, err := tg.Put(ctxT(t), key, strings.NewReader("body of "+key), mirror.Expect{}, mirror.Meta{JobID: key, FetchedAt: time.Now()})
		return err
	}

	// A SlowDown the SDK's retries outlast: stored, and writes spaced.
	proxy.fail(http.StatusServiceUnavailable, "SlowDown", 2)
	if err := put("slow"); err != nil {
		t.Fatalf("Put through two SlowDowns: %v", err)
	}
	if s := tg.WriteSpacing(); s <= 0 {
		t.Fatalf("write spacing %s after SlowDown, want more than 0", s)
	}
	for i := 0; tg.WriteSpacing() > 0; i++ {
		if i > 50 {
			t.Fatalf("spacing %s does not go away while writes succeed", tg.WriteSpacing())
		}
		if err := put(fmt.Sprintf("after-%d", i)); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		status int
		code   string
		want   string // FailureCode
	}{
		{http.StatusServiceUnavailable, "SlowDown", "unavailable"},
		{http.StatusInternalServerError, "InternalError", "unavailable"},
		{http.StatusBadGateway, "BadGateway", "unavailable"},
		{http.StatusForbidden, "AccessDenied", "unavailable"},
		{http.StatusNotFound, "NoSuchBucket", "unavailable"},
		{http.StatusBadRequest, "InvalidArgument", ""}, // about the object: the job's
	} {
		t.Run(tc.code, func(t *testing.T) {
			proxy.fail(tc.status, tc.code, -1)
			defer proxy.fail(0, "", 0)
			err := put("k-" + tc.code)
			if err == nil || mirror.FailureCode(err) != tc.want || !strings.Contains(err.Error(), tc.code) {
				t.Fatalf("Put answered %d %s: %v (code %q); want code %q", tc.status, tc.code, err, mirror.FailureCode(err), tc.want)
			}
			if tc.want != "" {
				if err := tg.Probe(ctxT(t)); mirror.FailureCode(err) != tc.want {
					t.Fatalf("Probe answered %s: %v", tc.code, err)
				}
			}
		})
	}
	proxy.fail(0, "", 0)
	for i := 0; tg.WriteSpacing() > 0; i++ { // the SlowDowns above spaced writes again
		if err := tg.Probe(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tg.Probe(ctxT(t)); err != nil {
		t.Fatalf("Probe once the store answers again: %v", err)
	}
}

// TestStoreChecksBytesInTransit: a body damaged on the way to the store
// (one byte flipped by the proxy) is refused by the store, since it
// carries its sha256 (x-amz-checksum-sha256), for a PutObject and for a
// part; nothing is stored, and the refusal is the object's, not a
// failure of the store.
func TestStoreChecksBytesInTransit(t *testing.T) {
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	proxy := newFaultProxy(t, srv)
	tg, err := bucket.Open(ctxT(t), "s3://mirror", &bucket.Options{Endpoint: proxy.URL, Credentials: buckettest.Credentials(),
		PartSize: bucket.MinPartSize, MaxRetryBackoff: 20 * time.Millisecond, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{100 << 10, 12 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			proxy.mu.Lock()
			proxy.flip = 10 // every attempt of the first request
			proxy.mu.Unlock()
			defer func() { proxy.mu.Lock(); proxy.flip = 0; proxy.mu.Unlock() }()
			key := fmt.Sprintf("damaged-%d", size)
			_, err := tg.Put(ctxT(t), key, bytes.NewReader(randBytes(size, 9)), mirror.Expect{}, mirror.Meta{JobID: "j", FetchedAt: time.Now()})
			if err == nil || mirror.FailureCode(err) != "" || !strings.Contains(err.Error(), "BadDigest") {
				t.Fatalf("Put of a body damaged in transit: %v; want the store's refusal, not a store failure", err)
			}
			if _, err := tg.Stat(ctxT(t), key); !errors.Is(err, mirror.ErrNotFound) {
				t.Fatalf("Stat: %v; want ErrNotFound", err)
			}
		})
	}
	if p := pendingUploads(t, srv, "mirror"); len(p) != 0 {
		t.Fatalf("uploads left: %v", p)
	}
}

// TestOpenNamesAnotherRegion: a bucket that answers HEAD as a bucket of
// another region does (AWS S3: 301 or 400 with x-amz-bucket-region; other
// stores: a bare 400) is reported as such, naming --s3-region, not as
// "400 Bad Request" alone.
func TestOpenNamesAnotherRegion(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		region string // x-amz-bucket-region; "": none
		want   []string
	}{
		{name: "named", status: http.StatusMovedPermanently, region: "eu-west-1",
			want: []string{`bucket "mirror" is in region eu-west-1, and requests are signed for us-east-1`, "--s3-region eu-west-1"}},
		{name: "named 400", status: http.StatusBadRequest, region: "ap-south-1", want: []string{"is in region ap-south-1", "--s3-region ap-south-1"}},
		{name: "bare 400", status: http.StatusBadRequest,
			want: []string{`bucket "mirror" answered HEAD with 400, as S3 answers for a bucket of another region: if its region is not us-east-1`, "--s3-region"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.region != "" {
					w.Header().Set("X-Amz-Bucket-Region", tc.region)
				}
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			_, err := bucket.Open(ctxT(t), "s3://mirror", &bucket.Options{Endpoint: srv.URL, Region: "us-east-1", Credentials: buckettest.Credentials()})
			if err == nil {
				t.Fatal("Open succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Open: %v\nwant %q in it", err, w)
				}
			}
			if tc.region != "" && !errors.Is(err, bucket.ErrWrongRegion) {
				t.Errorf("Open: %v, not ErrWrongRegion", err)
			}
		})
	}
}
