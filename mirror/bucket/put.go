package bucket

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"mime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/mirror"
)

// The object metadata a Put stores (sent as x-amz-meta-<name>). The
// content type is the object's own Content-Type.
const (
	MetaETag         = "mirrorworker-etag"
	MetaLastModified = "mirrorworker-last-modified"
	MetaSHA256       = "mirrorworker-sha256"
	MetaSize         = "mirrorworker-size"
	MetaJobID        = "mirrorworker-job-id"
	MetaFetchedAt    = "mirrorworker-fetched-at"
	MetaURL          = "mirrorworker-url"
	// MetaEnqueued is mirror.Meta.Enqueued, the order against deletes.
	MetaEnqueued = "mirrorworker-enqueued"
)

// maxMetaBytes is S3's limit of user metadata (keys and values), 2 KB.
const maxMetaBytes = 2000

// smallBody is how much of a body Put reads before it takes memory from
// the budget: the worker's own read-ahead (worker.ReadAheadSize) holds a
// body this small already.
const smallBody = 64 << 10

var smallBufs = sync.Pool{New: func() any { b := make([]byte, smallBody); return &b }}

// encodeMeta turns m into object metadata. Values that are not printable
// ASCII are RFC 2047 encoded (S3 takes ASCII only). If the whole is over
// S3's 2 KB, the URL goes first, then the validators: the object is
// stored, and the next fetch is only less conditional.
func encodeMeta(m mirror.Meta) map[string]string {
	md := map[string]string{
		MetaJobID:     m.JobID,
		MetaFetchedAt: m.FetchedAt.UTC().Format(time.RFC3339Nano),
	}
	if !m.Enqueued.IsZero() {
		md[MetaEnqueued] = m.Enqueued.UTC().Format(time.RFC3339Nano)
	}
	set := func(k, v string) {
		if v != "" {
			md[k] = mime.QEncoding.Encode("utf-8", v)
		}
	}
	set(MetaETag, m.ETag)
	set(MetaLastModified, m.LastModified)
	set(MetaSHA256, m.SHA256)
	set(MetaURL, m.URL)
	if m.Size >= 0 && (m.SHA256 != "" || m.Size > 0) {
		md[MetaSize] = strconv.FormatInt(m.Size, 10)
	}
	for _, drop := range []string{MetaURL, MetaETag, MetaLastModified} {
		if metaBytes(md) <= maxMetaBytes {
			break
		}
		delete(md, drop)
	}
	return md
}

func metaBytes(md map[string]string) int {
	n := 0
	for k, v := range md {
		n += len(k) + len(v)
	}
	return n
}

var wordDecoder = new(mime.WordDecoder)

// decodeMeta reads the metadata a Put stored; ok is false for an object
// without it (not stored by the worker, or by a tool that replaced it).
func decodeMeta(md map[string]string) (m mirror.Meta, hasSize, ok bool) {
	get := func(k string) string {
		v, found := md[k]
		if !found {
			// Some servers hand metadata names back capitalised.
			for mk, mv := range md {
				if strings.EqualFold(mk, k) {
					v = mv
					break
				}
			}
		}
		if d, err := wordDecoder.DecodeHeader(v); err == nil {
			return d
		}
		return v
	}
	at, err := time.Parse(time.RFC3339Nano, get(MetaFetchedAt))
	if err != nil {
		return mirror.Meta{}, false, false
	}
	m = mirror.Meta{
		ETag: get(MetaETag), LastModified: get(MetaLastModified), SHA256: get(MetaSHA256),
		JobID: get(MetaJobID), URL: get(MetaURL), FetchedAt: at,
	}
	if e, err := time.Parse(time.RFC3339Nano, get(MetaEnqueued)); err == nil {
		m.Enqueued = e
	}
	if s := get(MetaSize); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return mirror.Meta{}, false, false
		}
		m.Size, hasSize = n, true
	}
	return m, hasSize, true
}

// receipt records the sha256 of an object stored by multipart upload for
// a job that named none: it was known only when every part was sent, after
// the metadata was fixed. It lives under the reserved prefix and holds for
// the object with the S3 ETag it names.
type receipt struct {
	ObjectETag string `json:"object_etag"`
	SHA256     string `json:"sha256"`
	Size       int64  `json:"size"`
}

func (t *Target) receiptKey(key string) string { return t.reservedKey("sha256/" + key) }

// Stat returns the stored metadata of key, from one HEAD request. It
// returns mirror.ErrNotFound when there is no object, when the object has
// no metadata of the worker's or metadata that gives another size; a
// failure of the store wraps mirror.ErrUnavailable.
func (t *Target) Stat(ctx context.Context, key string) (mirror.Meta, error) {
	if err := mirror.ValidateKey(key); err != nil {
		return mirror.Meta{}, err
	}
	m, _, err := t.stat(ctx, key)
	return m, err
}

// stat is Stat that also returns the object's S3 ETag.
func (t *Target) stat(ctx context.Context, key string) (mirror.Meta, string, error) {
	out, err := t.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &t.bucket, Key: aws.String(t.ObjectKey(key))})
	if err != nil {
		if isNotFound(err) {
			return mirror.Meta{}, "", fmt.Errorf("stat %q: %w", key, mirror.ErrNotFound)
		}
		return mirror.Meta{}, "", fmt.Errorf("stat %q: %w", key, classify(err))
	}
	m, hasSize, ok := decodeMeta(out.Metadata)
	if !ok {
		return mirror.Meta{}, "", fmt.Errorf("stat %q: object without metadata: %w", key, mirror.ErrNotFound)
	}
	size := aws.ToInt64(out.ContentLength)
	if hasSize && size != m.Size {
		return mirror.Meta{}, "", fmt.Errorf("stat %q: object is %d bytes, meta says %d: %w", key, size, m.Size, mirror.ErrNotFound)
	}
	m.Key, m.Size, m.ContentType = key, size, aws.ToString(out.ContentType)
	etag := aws.ToString(out.ETag)
	if m.SHA256 == "" {
		if r, err := t.readReceipt(ctx, key); err == nil && r.ObjectETag == etag && r.Size == size {
			m.SHA256 = r.SHA256
		}
	}
	return m, etag, nil
}

func (t *Target) readReceipt(ctx context.Context, key string) (receipt, error) {
	out, err := t.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &t.bucket, Key: aws.String(t.receiptKey(key))})
	if err != nil {
		return receipt{}, err
	}
	defer out.Body.Close()
	var r receipt
	err = json.NewDecoder(io.LimitReader(out.Body, 4096)).Decode(&r)
	return r, err
}

// Put stores body under key, whole or not at all, with m as its metadata,
// and returns the metadata as stored (Key, SHA256 and Size from the bytes;
// a URL without userinfo). The bytes are checked against want before the
// object becomes visible: on mirror.ErrDigestMismatch,
// mirror.ErrSizeMismatch, a read error or a cancelled ctx nothing is
// stored and any upload is aborted.
//
// A body of up to the part size is read into memory, checked, and stored
// with one PutObject carrying its sha256 (x-amz-checksum-sha256, which the
// store verifies). A larger one is a multipart upload: parts of the part
// size, each with its own sha256, a few in flight, within the target's
// memory budget; it is completed only once the whole body's size and
// sha256 match.
func (t *Target) Put(ctx context.Context, key string, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	if err := mirror.ValidateKey(key); err != nil {
		return mirror.Meta{}, err
	}
	m.Key = key
	m.URL = authority.StripUserinfo(m.URL)
	r := mirror.ContextReader(ctx, body)
	headp := smallBufs.Get().(*[]byte)
	defer smallBufs.Put(headp)
	n, err := io.ReadFull(r, *headp)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return t.putOne(ctx, key, (*headp)[:n], want, m)
	case err != nil:
		return mirror.Meta{}, fmt.Errorf("put %q: read: %w", key, err)
	}
	// More than smallBody: from here on the bytes count against the budget.
	buf, err := t.getPart(ctx)
	if err != nil {
		return mirror.Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	copy(buf, (*headp)[:n])
	k, err := io.ReadFull(r, buf[n:])
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		defer t.putPart(buf)
		return t.putOne(ctx, key, buf[:n+k], want, m)
	case err != nil:
		t.putPart(buf)
		return mirror.Meta{}, fmt.Errorf("put %q: read: %w", key, err)
	}
	return t.putMultipart(ctx, key, buf, r, want, m, nil)
}

// check compares the bytes' sha256 and size with want.
func check(key, sum string, size int64, want mirror.Expect) error {
	if want.SHA256 != "" && !strings.EqualFold(want.SHA256, sum) {
		return fmt.Errorf("put %q: got sha256 %s, want %s: %w", key, sum, strings.ToLower(want.SHA256), mirror.ErrDigestMismatch)
	}
	if want.HasSize && want.Size >= 0 && want.Size != size {
		return fmt.Errorf("put %q: got %d bytes, want %d: %w", key, size, want.Size, mirror.ErrSizeMismatch)
	}
	return nil
}

// putOne stores a body held in memory with one PutObject.
func (t *Target) putOne(ctx context.Context, key string, data []byte, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	sum := sha256.Sum256(data)
	hexSum := hex.EncodeToString(sum[:])
	if err := check(key, hexSum, int64(len(data)), want); err != nil {
		return mirror.Meta{}, err
	}
	m.SHA256, m.Size = hexSum, int64(len(data))
	in := &s3.PutObjectInput{
		Bucket:         &t.bucket,
		Key:            aws.String(t.ObjectKey(key)),
		Body:           bytes.NewReader(data),
		ContentLength:  aws.Int64(int64(len(data))),
		ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(sum[:])),
		Metadata:       encodeMeta(m),
	}
	if m.ContentType != "" {
		in.ContentType = aws.String(m.ContentType)
	}
	if err := t.waitPace(ctx); err != nil {
		return mirror.Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	if _, err := t.client.PutObject(ctx, in, checksummed); err != nil {
		return mirror.Meta{}, fmt.Errorf("put %q: %w", key, t.failed(err))
	}
	t.pace.ok()
	return m, nil
}

// checksummed is the option of a request that carries the body's sha256
// as x-amz-checksum-sha256: it is signed with UNSIGNED-PAYLOAD, so that the
// SDK does not hash the body a second time for the signature; the store
// verifies the body against the checksum instead (ADR 0018).
func checksummed(o *s3.Options) {
	o.APIOptions = append(o.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)
}

// failed classifies err of a write and notes a throttle.
func (t *Target) failed(err error) error {
	if isThrottle(err) {
		t.throttled()
	}
	return classify(err)
}

var partBufs sync.Pool // of *[]byte of some part size

// getPart takes a part buffer from the memory budget.
func (t *Target) getPart(ctx context.Context) ([]byte, error) {
	if err := t.mem.Acquire(ctx, t.opt.PartSize); err != nil {
		return nil, err
	}
	if p, _ := partBufs.Get().(*[]byte); p != nil && int64(cap(*p)) >= t.opt.PartSize {
		return (*p)[:t.opt.PartSize], nil
	}
	return make([]byte, t.opt.PartSize), nil
}

// putPart gives a part buffer back to the budget.
func (t *Target) putPart(b []byte) {
	b = b[:cap(b)]
	partBufs.Put(&b)
	t.mem.Release(t.opt.PartSize)
}

// putMultipart stores a body larger than one part: first is its first
// part (a full buffer from getPart, which it gives back), r the rest. With
// res, the upload is res's, whose parts hold the body's first res.size
// bytes; first is nil and r brings the rest. A body that fails after at
// least one whole part keeps the upload for a retry (keepUpload).
func (t *Target) putMultipart(ctx context.Context, key string, first []byte, r io.Reader, want mirror.Expect, m mirror.Meta, res *keptUpload) (_ mirror.Meta, err error) {
	objKey := t.ObjectKey(key)
	if want.HasSize && want.Size > t.opt.PartSize*maxParts {
		if first != nil {
			t.putPart(first)
		}
		return mirror.Meta{}, fmt.Errorf("put %q: %d bytes is more than %d parts of %d bytes (raise --s3-part-size)", key, want.Size, maxParts, t.opt.PartSize)
	}
	if res != nil {
		return t.uploadParts(ctx, key, objKey, res.uploadID, res.parts, res.h, res.size, nil, r, want, m)
	}
	// The metadata is fixed when the upload is created: it carries the
	// job's sha256 and size, which the bytes must match before Complete.
	pm := m
	pm.SHA256 = strings.ToLower(want.SHA256)
	pm.Size = -1
	if want.HasSize {
		pm.Size = want.Size
	}
	cin := &s3.CreateMultipartUploadInput{
		Bucket: &t.bucket, Key: &objKey, Metadata: encodeMeta(pm),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
	}
	if m.ContentType != "" {
		cin.ContentType = aws.String(m.ContentType)
	}
	if err := t.waitPace(ctx); err != nil {
		t.putPart(first)
		return mirror.Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	created, err := t.client.CreateMultipartUpload(ctx, cin)
	if err != nil {
		t.putPart(first)
		return mirror.Meta{}, fmt.Errorf("put %q: create upload: %w", key, t.failed(err))
	}
	t.pace.ok()
	t.fault(FaultUploadCreated)
	return t.uploadParts(ctx, key, objKey, created.UploadId, nil, sha256.New(), 0, first, r, want, m)
}

// uploadParts goes on with the upload uploadID whose parts sent hold
// the body's first total bytes, hashing to h; sent are those parts,: it sends first (if not nil)
// and then r in parts, checks the whole body and completes the upload, or
// aborts it, or keeps it for a retry when r failed (keepUpload).
func (t *Target) uploadParts(ctx context.Context, key, objKey string, uploadID *string, sent []types.CompletedPart, h hash.Hash, total int64, first []byte, r io.Reader, want mirror.Expect, m mirror.Meta) (_ mirror.Meta, err error) {
	completed := false
	defer func() {
		if !completed {
			t.abort(ctx, objKey, uploadID)
		}
	}()

	up := &uploader{t: t, objKey: objKey, uploadID: uploadID, parts: append([]types.CompletedPart(nil), sent...)}
	up.ctx, up.cancel = context.WithCancel(ctx)
	defer up.cancel()
	up.inFlight = make(chan struct{}, t.opt.PartsInFlight)

	num := int32(len(sent)) + 1
	if first != nil {
		h.Write(first)
		total += int64(len(first))
		up.send(num, first, len(first))
		num++
	}
	var readErr error
	for ; up.ctx.Err() == nil; num++ {
		buf, err := t.getPart(up.ctx)
		if err != nil {
			break // up.ctx is done: a part failed, or ctx
		}
		n, err := io.ReadFull(r, buf)
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			// The body failed: the bytes of this short part are dropped,
			// so that the parts sent are whole ones a retry can go on from.
			t.putPart(buf)
			readErr = fmt.Errorf("read: %w", err)
			break
		}
		if n > 0 {
			if num > maxParts {
				t.putPart(buf)
				readErr = fmt.Errorf("more than %d parts of %d bytes (raise --s3-part-size)", maxParts, t.opt.PartSize)
				break
			}
			h.Write(buf[:n])
			total += int64(n)
			up.send(num, buf, n)
		} else {
			t.putPart(buf)
		}
		if err != nil {
			break // the end of the body
		}
	}
	up.wg.Wait()
	switch {
	case ctx.Err() != nil:
		return mirror.Meta{}, fmt.Errorf("put %q: %w", key, ctx.Err())
	case up.err != nil:
		return mirror.Meta{}, fmt.Errorf("put %q: upload part: %w", key, up.err)
	case readErr != nil:
		if t.keepUpload(key, objKey, uploadID, up.parts, h, total, want, m) {
			completed = true // not aborted: kept
			return mirror.Meta{}, fmt.Errorf("put %q: %w (%d bytes kept to resume)", key, readErr, total)
		}
		return mirror.Meta{}, fmt.Errorf("put %q: %w", key, readErr)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if err := check(key, sum, total, want); err != nil {
		return mirror.Meta{}, err
	}
	t.fault(FaultPartsUploaded)

	if err := t.waitPace(ctx); err != nil {
		return mirror.Meta{}, fmt.Errorf("put %q: %w", key, err)
	}
	done, err := t.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &t.bucket, Key: &objKey, UploadId: uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: up.parts},
	})
	if err != nil {
		return mirror.Meta{}, fmt.Errorf("put %q: complete upload: %w", key, t.failed(err))
	}
	completed = true
	t.pace.ok()
	t.fault(FaultCompleted)
	m.SHA256, m.Size = sum, total
	if want.SHA256 == "" {
		t.writeReceipt(ctx, key, receipt{ObjectETag: aws.ToString(done.ETag), SHA256: sum, Size: total})
	}
	return m, nil
}

// writeReceipt stores the sha256 of an object whose metadata could not
// carry it. Its failure is logged, not returned: the object is stored and
// its fetch stays conditional; only verify cannot check its bytes.
func (t *Target) writeReceipt(ctx context.Context, key string, r receipt) {
	data, _ := json.Marshal(r)
	_, err := t.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &t.bucket, Key: aws.String(t.receiptKey(key)), Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
	})
	if err != nil {
		t.log.Warn().Err(err).Str("key", key).Msg("store the sha256 receipt of an object uploaded in parts; verify cannot check its bytes")
	}
}

// abort aborts an upload that will not be completed, even when ctx is
// cancelled (a worker stopping); what it cannot abort, the next Open's
// sweep does.
func (t *Target) abort(ctx context.Context, objKey string, uploadID *string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err := t.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &t.bucket, Key: &objKey, UploadId: uploadID})
	if err != nil && !isCode(err, "NoSuchUpload") {
		t.log.Warn().Err(err).Str("key", objKey).Str("upload_id", aws.ToString(uploadID)).
			Msg("abort multipart upload failed; the next start-up's sweep aborts it")
	}
}

// uploader sends the parts of one multipart upload, at most
// PartsInFlight at once. The first failure cancels the rest.
type uploader struct {
	t        *Target
	objKey   string
	uploadID *string
	ctx      context.Context
	cancel   context.CancelFunc
	inFlight chan struct{}
	wg       sync.WaitGroup

	mu    sync.Mutex
	parts []types.CompletedPart // by part number - 1
	err   error                 // the first failure
}

// send uploads buf[:n] as part num and gives buf back when done.
func (u *uploader) send(num int32, buf []byte, n int) {
	select {
	case u.inFlight <- struct{}{}:
	case <-u.ctx.Done():
		u.t.putPart(buf)
		return
	}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		defer func() { <-u.inFlight }()
		defer u.t.putPart(buf)
		sum := sha256.Sum256(buf[:n])
		b64 := base64.StdEncoding.EncodeToString(sum[:])
		if err := u.t.waitPace(u.ctx); err != nil {
			u.fail(err)
			return
		}
		out, err := u.t.client.UploadPart(u.ctx, &s3.UploadPartInput{
			Bucket: &u.t.bucket, Key: &u.objKey, UploadId: u.uploadID, PartNumber: aws.Int32(num),
			Body: bytes.NewReader(buf[:n]), ContentLength: aws.Int64(int64(n)), ChecksumSHA256: &b64,
		}, checksummed)
		if err != nil {
			u.fail(u.t.failed(err))
			return
		}
		u.t.pace.ok()
		u.mu.Lock()
		if need := int(num); len(u.parts) < need {
			u.parts = append(u.parts, make([]types.CompletedPart, need-len(u.parts))...)
		}
		u.parts[num-1] = types.CompletedPart{PartNumber: aws.Int32(num), ETag: out.ETag, ChecksumSHA256: &b64}
		u.mu.Unlock()
		u.t.fault(FaultPartUploaded)
	}()
}

func (u *uploader) fail(err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.err == nil {
		u.err = err
		u.cancel()
	}
}
