package bucket

import (
	"context"
	"fmt"
	"hash"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/mirror"
)

// MaxKeptUploads bounds the multipart uploads a Target keeps for retries
// to resume (keepUpload): past it the oldest is aborted.
const MaxKeptUploads = 64

// keptUpload is a multipart upload whose body failed after whole parts,
// kept in memory for the job's retry: its parts hold the body's first size
// bytes, hashing to h. Only this process can resume it (the hash state is
// here); after a restart Open's sweep aborts it with the other abandoned
// uploads.
type keptUpload struct {
	t        *Target
	key      string
	objKey   string
	uploadID *string
	parts    []types.CompletedPart
	h        hash.Hash
	size     int64
	etag     string
	lastMod  string
	url      string
	want     mirror.Expect // the metadata fixed at the upload's creation says these
	at       time.Time
}

func (k *keptUpload) Partial() mirror.Partial {
	return mirror.Partial{Size: k.size, ETag: k.etag, LastModified: k.lastMod, URL: k.url}
}

func (k *keptUpload) Release() { k.t.putKept(k) }

func (k *keptUpload) Discard() { k.t.abort(context.Background(), k.objKey, k.uploadID) }

// keepUpload keeps an upload whose body failed, for a retry to resume, if
// it is worth it: at least one whole part sent, an answer with a validator
// to resume with (mirror.ResumeValidator). It reports whether it did.
func (t *Target) keepUpload(key, objKey string, uploadID *string, parts []types.CompletedPart, h hash.Hash, size int64, want mirror.Expect, m mirror.Meta) bool {
	if len(parts) == 0 || size <= 0 || mirror.ResumeValidator(m.ETag, m.LastModified) == "" {
		return false
	}
	t.putKept(&keptUpload{
		t: t, key: key, objKey: objKey, uploadID: uploadID, parts: parts, h: h, size: size,
		etag: m.ETag, lastMod: m.LastModified, url: authority.StripUserinfo(m.URL), want: want, at: t.clk.Now(),
	})
	return true
}

// putKept files k under its key, replacing (and aborting) an older one,
// and aborts the oldest beyond MaxKeptUploads.
func (t *Target) putKept(k *keptUpload) {
	var drop []*keptUpload
	t.keptMu.Lock()
	if t.kept == nil {
		t.kept = map[string]*keptUpload{}
	}
	if old := t.kept[k.key]; old != nil && old != k {
		drop = append(drop, old)
	}
	t.kept[k.key] = k
	for len(t.kept) > MaxKeptUploads {
		var oldest *keptUpload
		for _, c := range t.kept {
			if oldest == nil || c.at.Before(oldest.at) {
				oldest = c
			}
		}
		delete(t.kept, oldest.key)
		drop = append(drop, oldest)
	}
	t.keptMu.Unlock()
	for _, d := range drop {
		d.Discard()
	}
}

// Resume takes the upload kept for key, fetched from url, for one attempt;
// nil when there is none, when it was fetched from another URL, or when
// the store no longer has its parts as they were sent (ListParts: another
// process's sweep aborted it, say).
func (t *Target) Resume(ctx context.Context, key, url string) (mirror.Kept, error) {
	t.keptMu.Lock()
	k := t.kept[key]
	delete(t.kept, key)
	t.keptMu.Unlock()
	if k == nil {
		return nil, nil
	}
	if k.url != url {
		k.Discard()
		return nil, nil
	}
	if err := t.checkParts(ctx, k); err != nil {
		t.log.Debug().Err(err).Str("key", k.objKey).Msg("a kept upload cannot be resumed")
		k.Discard()
		return nil, nil
	}
	return k, nil
}

// checkParts compares the store's parts of k's upload with those sent.
func (t *Target) checkParts(ctx context.Context, k *keptUpload) error {
	var got []types.Part
	in := &s3.ListPartsInput{Bucket: &t.bucket, Key: &k.objKey, UploadId: k.uploadID}
	for {
		out, err := t.client.ListParts(ctx, in)
		if err != nil {
			return fmt.Errorf("list parts: %w", err)
		}
		got = append(got, out.Parts...)
		if !aws.ToBool(out.IsTruncated) || out.NextPartNumberMarker == nil {
			break
		}
		in.PartNumberMarker = out.NextPartNumberMarker
	}
	if len(got) != len(k.parts) {
		return fmt.Errorf("the store has %d parts, %d were sent", len(got), len(k.parts))
	}
	for i, p := range got {
		if aws.ToInt32(p.PartNumber) != int32(i+1) || aws.ToString(p.ETag) != aws.ToString(k.parts[i].ETag) {
			return fmt.Errorf("part %d is not the one sent", i+1)
		}
	}
	return nil
}

// PutResume is Put for an attempt that took k (Resume): the body's first
// from bytes are in k's parts and body brings the rest (from is k's
// size), or from is 0 and body is the whole body (k's upload is aborted).
// The whole body's size and sha256 are checked before the upload is
// completed, the hash going on from k's.
func (t *Target) PutResume(ctx context.Context, key string, k mirror.Kept, from int64, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	ku, ok := k.(*keptUpload)
	if !ok || ku.t != t || ku.key != key {
		return mirror.Meta{}, fmt.Errorf("put %q: resume: not an upload this target kept for the key", key)
	}
	// The upload's metadata was fixed with the first attempt's job: a job
	// that expects other bytes starts afresh.
	if from == 0 || from != ku.size || !strings.EqualFold(want.SHA256, ku.want.SHA256) || want.HasSize != ku.want.HasSize || want.Size != ku.want.Size {
		ku.Discard()
		if from != 0 {
			return mirror.Meta{}, fmt.Errorf("put %q: resume from byte %d, %d bytes kept for this job", key, from, ku.size)
		}
		return t.Put(ctx, key, body, want, m)
	}
	if err := mirror.ValidateKey(key); err != nil {
		ku.Discard()
		return mirror.Meta{}, err
	}
	m.Key = key
	m.URL = authority.StripUserinfo(m.URL)
	return t.putMultipart(ctx, key, nil, mirror.ContextReader(ctx, body), want, m, ku)
}
