// Package bucket is a mirror target in an S3-compatible object store: a
// bucket and an optional key prefix, s3://BUCKET[/PREFIX].
//
// It provides what the file target (package mirror) provides, for a
// bucket: an object is visible complete and verified, or not at all; its
// metadata (the origin's ETag and Last-Modified, content type, sha256,
// size, job id and fetch time) travels with it as object metadata, so the
// next fetch is conditional; a failure of the store itself (unreachable,
// 5xx, SlowDown, AccessDenied, NoSuchBucket) wraps mirror.ErrUnavailable,
// so the worker pauses instead of blaming the job; multipart uploads that
// a killed process abandoned are aborted when the target is opened. See
// docs/adr/0018-s3-client.md and docs/adr/0019-s3-whole-or-nothing.md.
//
// It does not create buckets, set lifecycle rules or manage credentials:
// those come from the standard AWS chain (environment, shared files, web
// identity) and never from a job.
package bucket

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/mirror"
)

// Scheme is the URL scheme of a bucket target.
const Scheme = "s3"

// Defaults of Options.
const (
	// DefaultPartSize is the size of a multipart upload's parts, and the
	// largest body stored with one PutObject. With at most 10,000 parts an
	// object may be 160 GiB at this size.
	DefaultPartSize = 16 << 20
	// MinPartSize and MaxPartSize bound Options.PartSize (S3 refuses
	// parts under 5 MiB but the last; larger parts only cost memory).
	MinPartSize = 5 << 20
	MaxPartSize = 64 << 20
	// DefaultPartsInFlight is how many parts of one upload are sent at once.
	DefaultPartsInFlight = 4
	// DefaultMemory bounds the bytes all Puts of a target hold in part
	// buffers at once (bodies of up to smallBody are not counted: the
	// worker holds them already).
	DefaultMemory = 256 << 20
	// DefaultMaxWriteSpacing caps the spacing of writes after SlowDown.
	DefaultMaxWriteSpacing = 5 * time.Second
	// DefaultMaxRetryBackoff caps the delay between attempts of one
	// request (four attempts in all).
	DefaultMaxRetryBackoff = 2 * time.Second
	// DefaultRegion is the region when neither the flag nor the AWS
	// configuration names one (S3-compatible servers mostly ignore it).
	DefaultRegion = "us-east-1"
)

// maxParts is S3's limit of parts in one upload.
const maxParts = 10000

// Options configure a Target. A nil *Options means the zero value, which
// is the defaults with credentials and region from the AWS chain.
type Options struct {
	// Endpoint is the S3 API's base URL (http://127.0.0.1:7070); empty:
	// AWS S3 of the region.
	Endpoint string
	// Region signs the requests; empty: the AWS configuration's
	// (AWS_REGION, shared files), else DefaultRegion.
	Region string
	// VirtualHost addresses buckets as BUCKET.host instead of host/BUCKET
	// (path-style, the default, which every S3-compatible server takes).
	VirtualHost bool
	// Credentials; nil: the standard AWS chain (environment, shared
	// files, web identity for IRSA, instance roles).
	Credentials aws.CredentialsProvider
	// PartSize is the size of a multipart upload's parts and the largest
	// body stored with one PutObject; 0: DefaultPartSize.
	PartSize int64
	// PartsInFlight is how many parts of one upload are sent at once; 0:
	// DefaultPartsInFlight.
	PartsInFlight int
	// Memory bounds the bytes of part buffers of all Puts at once; 0:
	// DefaultMemory. It is raised to PartSize*(PartsInFlight+1) if lower.
	Memory int64
	// SweepOlderThan: Open aborts the multipart uploads under the prefix
	// started more than this long ago; 0 aborts every one (uploads of
	// another process still running then fail and are retried).
	SweepOlderThan time.Duration
	// MaxWriteSpacing caps the spacing of writes after the store asked to
	// slow down; 0: DefaultMaxWriteSpacing.
	MaxWriteSpacing time.Duration
	// MaxRetryBackoff caps the SDK's delay between attempts of one
	// request; 0: DefaultMaxRetryBackoff.
	MaxRetryBackoff time.Duration
	// HTTPClient sends the requests; nil: the SDK's, with a 5 s connect
	// timeout.
	HTTPClient aws.HTTPClient
	// Clock paces writes after SlowDown; nil: the wall clock.
	Clock clock.Clock
	// Logger receives the sweep's and the pacing's lines.
	Logger zerolog.Logger
	// FaultHook, if set, is called at the named steps of a Put (the Fault*
	// constants), for crash tests that kill the process there.
	FaultHook func(point string)
}

// The steps of a multipart Put that Options.FaultHook is called at.
const (
	FaultUploadCreated = "s3-upload-created" // multipart upload created, no part sent
	FaultPartUploaded  = "s3-part-uploaded"  // a part uploaded (called after each)
	FaultPartsUploaded = "s3-parts-uploaded" // every part uploaded and checked, not completed
	FaultCompleted     = "s3-completed"      // upload completed, Put about to return
)

// Target is a mirror target in a bucket. It is safe for concurrent use;
// several processes may share a bucket and prefix.
type Target struct {
	client *s3.Client
	bucket string
	prefix string // "" or ending in "/"
	spec   string // s3://bucket/prefix, for logs
	region string // the region requests are signed for
	opt    Options
	clk    clock.Clock
	log    zerolog.Logger
	mem    *semaphore.Weighted
	pace   *pace

	// kept holds the uploads kept for retries to resume, by key
	// (resume.go).
	keptMu sync.Mutex
	kept   map[string]*keptUpload
}

// ParseSpec splits "s3://BUCKET[/PREFIX]" into the bucket and the key
// prefix ("" or ending in "/"). The prefix must be a valid key
// (mirror.ValidateKey) or empty.
func ParseSpec(spec string) (bucket, prefix string, err error) {
	u, err := url.Parse(spec)
	if err != nil {
		return "", "", fmt.Errorf("bucket: target %q: %w", spec, err)
	}
	if u.Scheme != Scheme {
		return "", "", fmt.Errorf("bucket: target %q: want s3://BUCKET[/PREFIX]", spec)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Port() != "" {
		return "", "", fmt.Errorf("bucket: target %q: want s3://BUCKET[/PREFIX] (credentials come from the AWS chain, the endpoint from --s3-endpoint)", spec)
	}
	if why := bucketNameProblem(u.Host); why != "" {
		return "", "", fmt.Errorf("bucket: target %q: bucket name %q %s", spec, u.Host, why)
	}
	prefix = strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := mirror.ValidateKey(prefix); err != nil {
			return "", "", fmt.Errorf("bucket: target %q: prefix: %w", spec, err)
		}
		prefix += "/"
	}
	return u.Host, prefix, nil
}

// bucketNameProblem checks S3's bucket naming rules (3 to 63 lowercase
// letters, digits, dots and hyphens, starting and ending with a letter or
// digit); it returns what is wrong, or "".
func bucketNameProblem(b string) string {
	if len(b) < 3 || len(b) > 63 {
		return "must be 3 to 63 characters"
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (c == '.' || c == '-') && i > 0 && i < len(b)-1
		if !ok {
			return "must be lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit"
		}
	}
	return ""
}

// Open opens the bucket target at spec, s3://BUCKET[/PREFIX]: it proves the
// bucket can be reached and listed with the credentials, then aborts the
// multipart uploads under the prefix that a killed process left behind
// (Options.SweepOlderThan). A bucket that does not exist, or credentials
// it refuses, fail here, before any job is taken.
func Open(ctx context.Context, spec string, o *Options) (*Target, error) {
	b, prefix, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	t := &Target{bucket: b, prefix: prefix, spec: "s3://" + b + "/" + prefix}
	if o != nil {
		t.opt = *o
	}
	t.log = t.opt.Logger
	if t.opt.PartSize == 0 {
		t.opt.PartSize = DefaultPartSize
	}
	if t.opt.PartSize < MinPartSize || t.opt.PartSize > MaxPartSize {
		return nil, fmt.Errorf("bucket: part size %d: want %d to %d bytes", t.opt.PartSize, MinPartSize, MaxPartSize)
	}
	if t.opt.PartsInFlight <= 0 {
		t.opt.PartsInFlight = DefaultPartsInFlight
	}
	if t.opt.Memory == 0 {
		t.opt.Memory = DefaultMemory
	}
	t.opt.Memory = max(t.opt.Memory, t.opt.PartSize*int64(t.opt.PartsInFlight+1))
	t.mem = semaphore.NewWeighted(t.opt.Memory)
	t.clk = t.opt.Clock
	if t.clk == nil {
		t.clk = clock.Real{}
	}
	t.pace = &pace{max: cmp.Or(t.opt.MaxWriteSpacing, DefaultMaxWriteSpacing)}
	if t.opt.Endpoint != "" {
		if u, err := url.Parse(t.opt.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("bucket: endpoint %q: want http(s)://host[:port]", t.opt.Endpoint)
		}
	}
	if t.client, err = t.newClient(ctx); err != nil {
		return nil, err
	}
	if err := t.headBucket(ctx); err != nil {
		return nil, fmt.Errorf("open %s: %w", t.spec, err)
	}
	if err := t.sweep(ctx); err != nil {
		return nil, fmt.Errorf("open %s: %w", t.spec, err)
	}
	return t, nil
}

func (t *Target) newClient(ctx context.Context) (*s3.Client, error) {
	lo := []func(*config.LoadOptions) error{
		config.WithRetryer(func() aws.Retryer {
			// No client-side retry quota: a store that throttles is slowed
			// by pace and, when retries run out, paused by the worker; a
			// quota would turn a throttle into a local error of its own.
			std := retry.NewStandard(func(so *retry.StandardOptions) {
				so.MaxAttempts = 4
				so.MaxBackoff = cmp.Or(t.opt.MaxRetryBackoff, DefaultMaxRetryBackoff)
				so.RateLimiter = ratelimit.None
			})
			return &noticingRetryer{Retryer: std, notice: t.throttled}
		}),
	}
	if t.opt.Region != "" {
		lo = append(lo, config.WithRegion(t.opt.Region))
	}
	if t.opt.Credentials != nil {
		lo = append(lo, config.WithCredentialsProvider(t.opt.Credentials))
	}
	hc := t.opt.HTTPClient
	if hc == nil {
		hc = awshttp.NewBuildableClient().
			WithDialerOptions(func(d *net.Dialer) { d.Timeout = 5 * time.Second }).
			WithTransportOptions(func(tr *http.Transport) {
				tr.MaxIdleConnsPerHost = 128
				tr.ResponseHeaderTimeout = 2 * time.Minute
			})
	}
	lo = append(lo, config.WithHTTPClient(hc))
	cfg, err := config.LoadDefaultConfig(ctx, lo...)
	if err != nil {
		return nil, fmt.Errorf("bucket: aws configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	t.region = cfg.Region
	return s3.NewFromConfig(cfg, func(so *s3.Options) {
		so.UsePathStyle = !t.opt.VirtualHost
		if t.opt.Endpoint != "" {
			so.BaseEndpoint = aws.String(t.opt.Endpoint)
		}
		// Since s3 v1.73 the SDK adds CRC32 checksums to every request,
		// which several S3-compatible servers refuse; the worker sends
		// the sha256 itself (ADR 0018).
		so.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		// No "Expect: 100-continue" on large bodies: a server (or proxy)
		// that does not answer it makes each part wait out the
		// transport's ExpectContinueTimeout (1 s) before its body goes.
		so.ContinueHeaderThresholdBytes = -1
	}), nil
}

// headBucket proves the bucket exists and the credentials reach it. A
// HEAD answer has no body, so a 404 names no code: it is NoSuchBucket.
//
// A bucket of another region than the one requests are signed for is
// answered with a bare 301, 400 or 403 (AWS S3 names the bucket's region
// in x-amz-bucket-region; other stores say nothing): the error says so
// and names the flag, rather than "400 Bad Request" alone.
func (t *Target) headBucket(ctx context.Context) error {
	_, err := t.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &t.bucket})
	code, status := errorCode(err)
	switch {
	case err == nil:
		return nil
	case status == http.StatusNotFound:
		return fmt.Errorf("%w: NoSuchBucket: bucket %q does not exist: %w", mirror.ErrUnavailable, t.bucket, err)
	case bucketRegion(err) != "" && bucketRegion(err) != t.region:
		return fmt.Errorf("%w: bucket %q is in region %s, and requests are signed for %s: give its region (--s3-region %s, or AWS_REGION): %w",
			ErrWrongRegion, t.bucket, bucketRegion(err), t.region, bucketRegion(err), err)
	case status == http.StatusMovedPermanently || status == http.StatusBadRequest && (code == "" || code == "BadRequest" || code == "AuthorizationHeaderMalformed"):
		return fmt.Errorf("bucket %q answered HEAD with %d, as S3 answers for a bucket of another region: if its region is not %s, the one requests are signed for, give it (--s3-region, or AWS_REGION): %w",
			t.bucket, status, t.region, err)
	}
	return classify(err)
}

// ErrWrongRegion is wrapped by Open's error when the bucket answered as a
// bucket of another region does.
var ErrWrongRegion = errors.New("bucket in another region")

// bucketRegion is the region an S3 answer names for its bucket
// (x-amz-bucket-region), "" when it names none.
func bucketRegion(err error) string {
	var re *awshttp.ResponseError
	if !errors.As(err, &re) || re.Response == nil || re.Response.Response == nil {
		return ""
	}
	return re.Response.Header.Get("X-Amz-Bucket-Region")
}

// String returns the target as s3://BUCKET/PREFIX.
func (t *Target) String() string { return t.spec }

// Root returns the target as s3://BUCKET/PREFIX, as FileTarget.Root
// returns its directory: where an operator finds the objects.
func (t *Target) Root() string { return t.spec }

// Bucket returns the bucket's name and Prefix the key prefix ("" or
// ending in "/").
func (t *Target) Bucket() string { return t.bucket }
func (t *Target) Prefix() string { return t.prefix }

// Client returns the S3 client, for tools (verify) that walk the bucket.
func (t *Target) Client() *s3.Client { return t.client }

// ObjectKey returns the bucket key of a mirror key.
func (t *Target) ObjectKey(key string) string { return t.prefix + key }

// reservedKey is where the target's own objects (probes, receipts) live.
func (t *Target) reservedKey(rest string) string {
	return t.prefix + mirror.ReservedDir + "/" + rest
}

func (t *Target) fault(point string) {
	if t.opt.FaultHook != nil {
		t.opt.FaultHook(point)
	}
}

// sweep aborts the multipart uploads under the prefix older than
// SweepOlderThan: those of a killed process, which would otherwise cost
// storage until a lifecycle rule removes them.
func (t *Target) sweep(ctx context.Context) error {
	cutoff := t.clk.Now().Add(-t.opt.SweepOlderThan)
	in := &s3.ListMultipartUploadsInput{Bucket: &t.bucket}
	if t.prefix != "" {
		in.Prefix = aws.String(t.prefix)
	}
	aborted := 0
	for {
		out, err := t.client.ListMultipartUploads(ctx, in)
		if err != nil {
			return fmt.Errorf("list abandoned uploads: %w", classify(err))
		}
		for _, u := range out.Uploads {
			if t.opt.SweepOlderThan > 0 && u.Initiated != nil && u.Initiated.After(cutoff) {
				continue
			}
			_, err := t.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &t.bucket, Key: u.Key, UploadId: u.UploadId})
			if err != nil && !isCode(err, "NoSuchUpload") {
				return fmt.Errorf("abort abandoned upload of %q: %w", aws.ToString(u.Key), classify(err))
			}
			aborted++
			t.log.Info().Str("key", aws.ToString(u.Key)).Str("upload_id", aws.ToString(u.UploadId)).
				Time("initiated", aws.ToTime(u.Initiated)).Msg("aborted a multipart upload a stopped worker left unfinished")
		}
		if !aws.ToBool(out.IsTruncated) {
			break
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
	if aborted > 0 {
		t.log.Info().Int("aborted", aborted).Str("target", t.spec).Msg("abandoned multipart uploads swept")
	}
	return nil
}

// ProbeSize is how many bytes Probe writes.
const ProbeSize = 4 << 10

// Probe proves the bucket takes writes now: it stores a small object under
// the reserved prefix and deletes it. Its error is the one a Put would
// meet; mirror.FailureCode names it.
func (t *Target) Probe(ctx context.Context) error {
	var rnd [8]byte
	rand.Read(rnd[:])
	key := t.reservedKey("probe/" + hex.EncodeToString(rnd[:]))
	if err := t.waitPace(ctx); err != nil {
		return err
	}
	_, err := t.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &t.bucket, Key: &key, Body: strings.NewReader(strings.Repeat("p", ProbeSize)), ContentLength: aws.Int64(ProbeSize),
	})
	if err != nil {
		return fmt.Errorf("probe %s: %w", t.spec, classify(err))
	}
	t.pace.ok()
	if _, err := t.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &t.bucket, Key: &key}); err != nil {
		return fmt.Errorf("probe %s: delete: %w", t.spec, classify(err))
	}
	return nil
}
