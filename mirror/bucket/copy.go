package bucket

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/sumindex"
)

// MaxCopySize is the largest object one CopyObject copies (S3's limit);
// a larger one would need a multipart copy, which Copy does not do: the
// job is fetched instead.
const MaxCopySize = 5 << 30

// Copy stores the object under from again under to with one server-side
// CopyObject (the bytes do not travel through the worker), with m as its
// metadata (Key, SHA256 and Size from from's; ContentType from from's
// when m has none). It copies only if from's metadata still names want's
// sha256 and size, and only the very object it read that from (the copy
// is conditional on its S3 ETag): otherwise it stores nothing and returns
// an error wrapping mirror.ErrDigestMismatch, mirror.ErrSizeMismatch or
// mirror.ErrNotFound. The store vouches for the bytes it copies; the
// sha256 in from's metadata was checked by the store when from was
// uploaded (x-amz-checksum-sha256, or the whole body's at completion).
func (t *Target) Copy(ctx context.Context, from, to string, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	if err := mirror.ValidateKey(to); err != nil {
		return mirror.Meta{}, err
	}
	if err := mirror.ValidateKey(from); err != nil {
		return mirror.Meta{}, err
	}
	src, etag, err := t.stat(ctx, from)
	if err != nil {
		return mirror.Meta{}, fmt.Errorf("copy %q to %q: %w", from, to, err)
	}
	switch {
	case src.SHA256 == "":
		return mirror.Meta{}, fmt.Errorf("copy %q to %q: its sha256 is unknown: %w", from, to, mirror.ErrNotFound)
	case want.SHA256 != "" && !strings.EqualFold(src.SHA256, want.SHA256):
		return mirror.Meta{}, fmt.Errorf("copy %q to %q: it holds sha256 %s now, want %s: %w", from, to, src.SHA256, strings.ToLower(want.SHA256), mirror.ErrDigestMismatch)
	case want.HasSize && want.Size >= 0 && src.Size != want.Size:
		return mirror.Meta{}, fmt.Errorf("copy %q to %q: it holds %d bytes now, want %d: %w", from, to, src.Size, want.Size, mirror.ErrSizeMismatch)
	case src.Size > MaxCopySize:
		return mirror.Meta{}, fmt.Errorf("copy %q to %q: %d bytes is over one CopyObject's %d", from, to, src.Size, int64(MaxCopySize))
	}
	m.Key, m.SHA256, m.Size = to, src.SHA256, src.Size
	m.URL = authority.StripUserinfo(m.URL)
	if m.ContentType == "" {
		m.ContentType = src.ContentType
	}
	in := &s3.CopyObjectInput{
		Bucket:            &t.bucket,
		Key:               aws.String(t.ObjectKey(to)),
		CopySource:        aws.String(url.PathEscape(t.bucket) + "/" + escapeKey(t.ObjectKey(from))),
		CopySourceIfMatch: aws.String(etag),
		MetadataDirective: types.MetadataDirectiveReplace,
		Metadata:          encodeMeta(m),
	}
	if m.ContentType != "" {
		in.ContentType = aws.String(m.ContentType)
	}
	if err := t.waitPace(ctx); err != nil {
		return mirror.Meta{}, fmt.Errorf("copy %q to %q: %w", from, to, err)
	}
	if _, err := t.client.CopyObject(ctx, in); err != nil {
		if isCode(err, "PreconditionFailed") || isNotFound(err) {
			return mirror.Meta{}, fmt.Errorf("copy %q to %q: the object changed since it was read: %w", from, to, mirror.ErrNotFound)
		}
		return mirror.Meta{}, fmt.Errorf("copy %q to %q: %w", from, to, t.failed(err))
	}
	t.pace.ok()
	return m, nil
}

// escapeKey escapes a bucket key for x-amz-copy-source, segment by
// segment so that the slashes stay.
func escapeKey(k string) string {
	segs := strings.Split(k, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

// SumIndex is a bucket's sha256 index (a sumindex.Index): one small
// object per digest under the reserved prefix, .mirrorworker/by-sha256/
// <hex>, whose body is the key. Every pod writing the bucket shares it
// with no lock: a PutObject replaces an entry whole, and an entry is only
// a hint that a copy checks. Safe for concurrent use.
type SumIndex struct{ t *Target }

// SumIndex returns the bucket's sha256 index.
func (t *Target) SumIndex() *SumIndex { return &SumIndex{t: t} }

// SumIndexPrefix is where the entries live, under the reserved prefix.
const SumIndexPrefix = "by-sha256/"

func (x *SumIndex) entryKey(sum string) string { return x.t.reservedKey(SumIndexPrefix + sum) }

// Lookup returns the key recorded for sum, or an error wrapping
// mirror.ErrNotFound.
func (x *SumIndex) Lookup(ctx context.Context, sum string) (string, error) {
	out, err := x.t.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &x.t.bucket, Key: aws.String(x.entryKey(sum))})
	if err != nil {
		if isNotFound(err) {
			return "", fmt.Errorf("look up %s: %w", sum, mirror.ErrNotFound)
		}
		return "", fmt.Errorf("look up %s: %w", sum, classify(err))
	}
	defer out.Body.Close()
	b, err := io.ReadAll(io.LimitReader(out.Body, mirror.MaxKeyLen+1))
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", sum, err)
	}
	key := string(b)
	if mirror.ValidateKey(key) != nil {
		return "", fmt.Errorf("look up %s: entry is not a key: %w", sum, mirror.ErrNotFound)
	}
	return key, nil
}

// Add records key for sum.
func (x *SumIndex) Add(ctx context.Context, sum, key string) error {
	_, err := x.t.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &x.t.bucket, Key: aws.String(x.entryKey(sum)),
		Body: bytes.NewReader([]byte(key)), ContentLength: aws.Int64(int64(len(key))),
	})
	if err != nil {
		return fmt.Errorf("add %s: %w", sum, classify(err))
	}
	return nil
}

// Forget removes sum's entry if it names key. (Another pod may replace it
// between the read and the delete; the entry is then lost, which costs
// one fetch.)
func (x *SumIndex) Forget(ctx context.Context, sum, key string) error {
	cur, err := x.Lookup(ctx, sum)
	if err != nil || cur != key {
		return nil
	}
	if _, err := x.t.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &x.t.bucket, Key: aws.String(x.entryKey(sum))}); err != nil && !isNotFound(err) {
		return fmt.Errorf("forget %s: %w", sum, classify(err))
	}
	return nil
}

// Entries calls fn with every digest that has an entry; fn's error stops
// the walk and is returned (verify's rebuild).
func (x *SumIndex) Entries(ctx context.Context, fn func(sum string) error) error {
	prefix := x.entryKey("")
	p := s3.NewListObjectsV2Paginator(x.t.client, &s3.ListObjectsV2Input{Bucket: &x.t.bucket, Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list sha256 index: %w", classify(err))
		}
		for _, o := range page.Contents {
			if err := fn(strings.TrimPrefix(aws.ToString(o.Key), prefix)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Replace makes the index hold exactly entries (verify's rebuild): an
// entry missing or naming another key is written, one no longer wanted is
// deleted. It returns how many were added, dropped and changed. Pods that
// store objects meanwhile may lose an entry, which costs one fetch.
func (x *SumIndex) Replace(ctx context.Context, entries []sumindex.Entry) (added, dropped, changed int, err error) {
	have := map[string]bool{}
	if err := x.Entries(ctx, func(sum string) error { have[sum] = true; return nil }); err != nil {
		return 0, 0, 0, err
	}
	want := make(map[string]bool, len(entries))
	for _, e := range entries {
		want[e.Sum] = true
		if have[e.Sum] {
			if cur, err := x.Lookup(ctx, e.Sum); err == nil && cur == e.Key {
				continue
			}
			changed++
		} else {
			added++
		}
		if err := x.Add(ctx, e.Sum, e.Key); err != nil {
			return added, dropped, changed, err
		}
	}
	for sum := range have {
		if want[sum] {
			continue
		}
		if _, err := x.t.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &x.t.bucket, Key: aws.String(x.entryKey(sum))}); err != nil && !isNotFound(err) {
			return added, dropped, changed, fmt.Errorf("drop sha256 index entry %s: %w", sum, classify(err))
		}
		dropped++
	}
	return added, dropped, changed, nil
}
