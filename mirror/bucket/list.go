package bucket

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/mirrorworker/mirrorworker/mirror"
)

// List calls fn with the key of every object under the prefix, in the
// bucket's (lexical) order, skipping the reserved prefix; fn's error
// stops the walk and is returned.
func (t *Target) List(ctx context.Context, fn func(key string) error) error {
	in := &s3.ListObjectsV2Input{Bucket: &t.bucket}
	if t.prefix != "" {
		in.Prefix = aws.String(t.prefix)
	}
	reserved := t.prefix + mirror.ReservedDir + "/"
	p := s3.NewListObjectsV2Paginator(t.client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("list %s: %w", t.spec, classify(err))
		}
		for _, o := range page.Contents {
			k := aws.ToString(o.Key)
			if strings.HasPrefix(k, reserved) || strings.HasSuffix(k, "/") {
				continue // the target's own objects; directory markers
			}
			if err := fn(strings.TrimPrefix(k, t.prefix)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Read opens the object stored under key for reading.
func (t *Target) Read(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := mirror.ValidateKey(key); err != nil {
		return nil, err
	}
	out, err := t.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &t.bucket, Key: aws.String(t.ObjectKey(key))})
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("read %q: %w", key, mirror.ErrNotFound)
		}
		return nil, fmt.Errorf("read %q: %w", key, classify(err))
	}
	return out.Body, nil
}

// Remove deletes the object under key (and its receipt), so that its next
// fetch is unconditional (an audit's repair of a corrupt object). A key
// with nothing stored is not an error.
func (t *Target) Remove(ctx context.Context, key string) error {
	if err := mirror.ValidateKey(key); err != nil {
		return err
	}
	for _, k := range []string{t.ObjectKey(key), t.receiptKey(key)} {
		if _, err := t.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &t.bucket, Key: aws.String(k)}); err != nil && !isNotFound(err) {
			return fmt.Errorf("remove %q: %w", key, classify(err))
		}
	}
	return nil
}
