package bucket_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
	"github.com/mirrorworker/mirrorworker/mirror/sumindex"
)

// TestCopyKnownInBucket: with the bucket's index, a second name of the
// same bytes is a server-side copy with its own metadata; an entry whose
// key was replaced is stale, and nothing is copied.
func TestCopyKnownInBucket(t *testing.T) {
	t.Parallel()
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "dedupe")
	ctx := ctxT(t)
	b := open(t, srv, "s3://dedupe/pfx", nil)
	tgt := sumindex.Wrap(b, b.SumIndex(), zerolog.Nop())
	body := randBytes(70<<10, 7) // over the small-body read-ahead
	sum := hexSum(body)
	if _, err := tgt.Put(ctx, "a/one.whl", bytes.NewReader(body), mirror.Expect{SHA256: sum}, mirror.Meta{URL: "http://o/one", ETag: `"1"`, ContentType: "application/zip"}); err != nil {
		t.Fatal(err)
	}
	if k, err := b.SumIndex().Lookup(ctx, sum); err != nil || k != "a/one.whl" {
		t.Fatalf("entry %q, %v", k, err)
	}
	from, m, err := tgt.CopyKnown(ctx, "b/two.whl", mirror.Expect{SHA256: sum, Size: int64(len(body)), HasSize: true}, mirror.Meta{URL: "http://o/two", JobID: "j2"})
	if err != nil || from != "a/one.whl" {
		t.Fatalf("CopyKnown: %q, %v", from, err)
	}
	if m.SHA256 != sum || m.Size != int64(len(body)) {
		t.Errorf("meta %+v", m)
	}
	st, err := b.Stat(ctx, "b/two.whl")
	if err != nil || st.SHA256 != sum || st.URL != "http://o/two" || st.JobID != "j2" || st.ETag != "" || st.ContentType != "application/zip" {
		t.Errorf("stored meta %+v, %v; want its own URL and job, the source's type, no ETag", st, err)
	}
	if got := readAll(t, b, "b/two.whl"); !bytes.Equal(got, body) {
		t.Errorf("copy holds %d bytes, want the %d stored", len(got), len(body))
	}

	// Replaced behind the index's back: the entry is stale.
	if _, err := b.Put(ctx, "a/one.whl", bytes.NewReader([]byte("other")), mirror.Expect{}, mirror.Meta{}); err != nil {
		t.Fatal(err)
	}
	_, _, err = tgt.CopyKnown(ctx, "c/three.whl", mirror.Expect{SHA256: sum}, mirror.Meta{})
	if !errors.Is(err, sumindex.ErrNoCopy) {
		t.Fatalf("CopyKnown from a replaced key: %v, want ErrNoCopy", err)
	}
	if _, err := b.Stat(ctx, "c/three.whl"); !errors.Is(err, mirror.ErrNotFound) {
		t.Errorf("c/three.whl stored (%v) from a stale entry", err)
	}
	if _, err := b.SumIndex().Lookup(ctx, sum); !errors.Is(err, mirror.ErrNotFound) {
		t.Errorf("stale entry kept: %v", err)
	}

	// A rebuild names the copy, the one key left with those bytes.
	added, dropped, changed, err := b.SumIndex().Replace(ctx, []sumindex.Entry{{Sum: sum, Key: "b/two.whl"}})
	if err != nil || added != 1 || dropped != 0 || changed != 0 {
		t.Errorf("Replace: added %d dropped %d changed %d, %v; want 1 0 0", added, dropped, changed, err)
	}
}

func readAll(t *testing.T, b interface {
	Read(ctx context.Context, key string) (io.ReadCloser, error)
}, key string) []byte {
	t.Helper()
	r, err := b.Read(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return got
}
