package bucket_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/bucket"
	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

// TestResumeKeptUpload: a multipart body that fails after two whole
// parts and a bit (with a strong ETag) keeps its upload; the retry takes
// it (its parts checked with ListParts), sends only the rest, and the
// object completed is the whole body, its sha256 checked over all of it.
// A whole body instead, or another URL, aborts the kept upload.
func TestResumeKeptUpload(t *testing.T) {
	const part = bucket.MinPartSize
	data := randBytes(4*part+123, 39)
	want := mirror.Expect{SHA256: hexSum(data), Size: int64(len(data)), HasSize: true}
	const url = "http://origin.test/big"
	meta := mirror.Meta{URL: url, ETag: `"v1"`, JobID: "j", FetchedAt: time.Now()}
	tests := []struct {
		name     string
		resumeAt string
		whole    bool // the retry's answer is the whole body (200)
	}{
		{name: "rest", resumeAt: url},
		{name: "whole body", resumeAt: url, whole: true},
		{name: "another url", resumeAt: "http://origin.test/other"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := buckettest.Start(t)
			srv.CreateBucket(t, "mirror")
			tg := open(t, srv, "s3://mirror", &bucket.Options{PartSize: part, PartsInFlight: 2})
			ctx := ctxT(t)
			if _, err := tg.Put(ctx, "big", &failingReader{r: bytes.NewReader(data), n: 2*part + 1000}, want, meta); err == nil {
				t.Fatal("Put of a cut body succeeded")
			}
			if p := pendingUploads(t, srv, "mirror"); len(p) != 1 {
				t.Fatalf("uploads pending after the cut: %v, want the kept one", p)
			}
			k, err := tg.Resume(ctx, "big", tc.resumeAt)
			if err != nil {
				t.Fatal(err)
			}
			if tc.resumeAt != url {
				if k != nil {
					t.Fatalf("resumed %+v for another URL", k.Partial())
				}
				if p := pendingUploads(t, srv, "mirror"); len(p) != 0 {
					t.Errorf("kept upload not aborted: %v", p)
				}
				return
			}
			if k == nil || k.Partial().Size != 2*part || k.Partial().IfRange() != `"v1"` {
				t.Fatalf("kept %v, want the two whole parts (%d bytes)", k, 2*part)
			}
			// Released and taken again: the same upload.
			k.Release()
			if k, err = tg.Resume(ctx, "big", url); err != nil || k == nil {
				t.Fatalf("Resume after Release: %v, %v", k, err)
			}
			from, rest := k.Partial().Size, io.Reader(bytes.NewReader(data[2*part:]))
			if tc.whole {
				from, rest = 0, bytes.NewReader(data)
			}
			m, err := tg.PutResume(ctx, "big", k, from, rest, want, meta)
			if err != nil {
				t.Fatalf("PutResume: %v", err)
			}
			if m.SHA256 != want.SHA256 || m.Size != want.Size {
				t.Errorf("stored sha256 %s size %d, want the whole body's", m.SHA256, m.Size)
			}
			rc, err := tg.Read(ctx, "big")
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("stored object (%d bytes, %v) is not the body", len(got), err)
			}
			if p := pendingUploads(t, srv, "mirror"); len(p) != 0 {
				t.Errorf("uploads left: %v", p)
			}
		})
	}
}
