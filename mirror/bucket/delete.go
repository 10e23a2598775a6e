package bucket

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/mirrorworker/mirrorworker/mirror"
)

// maxTombstone bounds the read of one tombstone object (a key of 1 KiB, a
// URL of 8 KiB and a few short fields).
const maxTombstone = 32 << 10

func (t *Target) tombKey(key string) string { return t.reservedKey(mirror.TombstoneDir + "/" + key) }

// Delete removes the object under key (and its receipt) and leaves ts as
// its tombstone, an object under the reserved prefix: the tombstone is
// stored before the object goes, so that a failure between the two leaves
// a tombstone that supersedes the object, never a key a late fetch could
// bring back (mirror.FileTarget.Delete does the same). ts.Key, SHA256 and
// Size are filled in here.
func (t *Target) Delete(ctx context.Context, key string, ts mirror.Tombstone) error {
	if err := mirror.ValidateKey(key); err != nil {
		return err
	}
	ts.Key = key
	if m, err := t.Stat(ctx, key); err == nil {
		ts.SHA256, ts.Size = m.SHA256, m.Size
	}
	data, err := mirror.EncodeTombstone(ts)
	if err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	if err := t.waitPace(ctx); err != nil {
		return err
	}
	_, err = t.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &t.bucket, Key: aws.String(t.tombKey(key)), Body: bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))), ContentType: aws.String("application/json"),
	})
	if err != nil {
		return fmt.Errorf("delete %q: tombstone: %w", key, t.failed(err))
	}
	t.pace.ok()
	if err := t.Remove(ctx, key); err != nil {
		return fmt.Errorf("delete %q: %w", key, err)
	}
	return nil
}

// Tombstone returns the tombstone of key, or mirror.ErrNotFound when it
// has none.
func (t *Target) Tombstone(ctx context.Context, key string) (mirror.Tombstone, error) {
	if err := mirror.ValidateKey(key); err != nil {
		return mirror.Tombstone{}, err
	}
	return t.readTombstone(ctx, t.tombKey(key))
}

func (t *Target) readTombstone(ctx context.Context, objKey string) (mirror.Tombstone, error) {
	out, err := t.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &t.bucket, Key: aws.String(objKey)})
	if err != nil {
		if isNotFound(err) {
			return mirror.Tombstone{}, fmt.Errorf("tombstone %q: %w", objKey, mirror.ErrNotFound)
		}
		return mirror.Tombstone{}, fmt.Errorf("tombstone %q: %w", objKey, classify(err))
	}
	defer out.Body.Close()
	data, err := io.ReadAll(io.LimitReader(out.Body, maxTombstone))
	if err != nil {
		return mirror.Tombstone{}, fmt.Errorf("tombstone %q: %w", objKey, classify(err))
	}
	ts, err := mirror.DecodeTombstone(data)
	if err != nil {
		return mirror.Tombstone{}, fmt.Errorf("tombstone %q: %w", objKey, err)
	}
	return ts, nil
}

// ClearTombstone removes key's tombstone, if there is one: a fetch
// enqueued after the delete stored the key again.
func (t *Target) ClearTombstone(ctx context.Context, key string) error {
	if err := mirror.ValidateKey(key); err != nil {
		return err
	}
	if _, err := t.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &t.bucket, Key: aws.String(t.tombKey(key))}); err != nil && !isNotFound(err) {
		return fmt.Errorf("clear tombstone %q: %w", key, classify(err))
	}
	return nil
}

// ListTombstones calls fn with every tombstone under the prefix, in the
// bucket's (lexical) order; fn's error stops the walk and is returned. An
// object that cannot be read as a tombstone is skipped.
func (t *Target) ListTombstones(ctx context.Context, fn func(mirror.Tombstone) error) error {
	prefix := t.tombKey("")
	p := s3.NewListObjectsV2Paginator(t.client, &s3.ListObjectsV2Input{Bucket: &t.bucket, Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list tombstones %s: %w", t.spec, classify(err))
		}
		for _, o := range page.Contents {
			k := aws.ToString(o.Key)
			if strings.HasSuffix(k, "/") {
				continue
			}
			ts, err := t.readTombstone(ctx, k)
			if err != nil {
				if mirror.FailureCode(err) != "" {
					return err
				}
				continue
			}
			if err := fn(ts); err != nil {
				return err
			}
		}
	}
	return nil
}
