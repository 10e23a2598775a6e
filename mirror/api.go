// Package mirror stores fetched objects durably in a mirror target.
package mirror

import (
	"errors"
	"syscall"
	"time"
)

// This file holds the types other packages program against. Fields may be
// added; existing ones keep their meaning.

// Meta is what the target remembers about a stored object. It makes the next
// fetch conditional and lets an operator trace an object to its job.
type Meta struct {
	Key          string    `json:"key"`
	URL          string    `json:"url"` // without userinfo
	ETag         string    `json:"etag,omitempty"`
	LastModified string    `json:"last_modified,omitempty"`
	ContentType  string    `json:"content_type,omitempty"`
	SHA256       string    `json:"sha256"`
	Size         int64     `json:"size"`
	FetchedAt    time.Time `json:"fetched_at"`
	JobID        string    `json:"job_id"`
	// Enqueued is when the job that stored the object was stored in the
	// job stream: the order against the key's deletes (Supersedes). Zero
	// for objects stored by earlier versions.
	Enqueued time.Time `json:"enqueued,omitzero"`
}

// Expect is what the job says the bytes must be; zero fields are not checked.
type Expect struct {
	SHA256  string // 64 lowercase hex
	Size    int64  // -1 or 0 with HasSize false: unchecked
	HasSize bool
}

var (
	// ErrNotFound: no object (or no metadata) under the key.
	ErrNotFound = errors.New("mirror: not found")
	// ErrDigestMismatch: the bytes do not match Expect.SHA256; nothing was stored.
	ErrDigestMismatch = errors.New("mirror: sha256 mismatch")
	// ErrSizeMismatch: the byte count does not match Expect.Size; nothing was stored.
	ErrSizeMismatch = errors.New("mirror: size mismatch")
	// ErrInvalidKey: the key is not a safe relative path.
	ErrInvalidKey = errors.New("mirror: invalid key")
	// ErrUnavailable: the target itself cannot store anything now (an
	// object store that cannot be reached, say). A target wraps it around
	// failures of its own, as opposed to failures of one object or key.
	ErrUnavailable = errors.New("mirror: target unavailable")
)

// targetFailures are the errors that say the target itself is failing,
// whatever is being stored: full, over quota, read-only or broken.
var targetFailures = []struct {
	err  error
	code string
}{
	{syscall.ENOSPC, "ENOSPC"},
	{syscall.EDQUOT, "EDQUOT"},
	{syscall.EROFS, "EROFS"},
	{syscall.EIO, "EIO"},
	{ErrUnavailable, "unavailable"},
}

// FailureCode names an error of the target itself, one no job caused and
// no retry of the job can cure: "ENOSPC", "EDQUOT", "EROFS", "EIO" or
// "unavailable" (ErrUnavailable). It returns "" for every other error.
func FailureCode(err error) string {
	if err == nil {
		return ""
	}
	for _, f := range targetFailures {
		if errors.Is(err, f.err) {
			return f.code
		}
	}
	return ""
}
