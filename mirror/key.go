package mirror

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// ReservedDir is the directory under the root that holds the target's own
// files (temporary files and metadata). No key may name anything under it.
// Package jobs refuses such targets with this rule (jobs.CheckTarget).
const ReservedDir = ".mirrorworker"

// MaxKeyLen is the longest key in bytes.
const MaxKeyLen = 1024

// MaxSegmentLen keeps "<segment>.json", the metadata file's name, within the
// 255-byte name limit of common file systems.
const MaxSegmentLen = 255 - len(".json")

// KeyError is ValidateKey's error: Why says what is wrong with Key. It
// wraps ErrInvalidKey.
type KeyError struct {
	Key string
	Why string // e.g. `must not contain a ".." segment`
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("key %q %s: %v", e.Key, e.Why, ErrInvalidKey)
}

func (e *KeyError) Unwrap() error { return ErrInvalidKey }

// ValidateKey checks that key is a safe relative path inside the target:
// at most MaxKeyLen bytes of UTF-8, '/'-separated, no leading '/', no empty,
// "." or ".." segment, no '\', NUL or other control character, no segment
// longer than MaxSegmentLen bytes, and not under ReservedDir (compared
// without regard to case, for case-insensitive file systems). This is the
// one home of the target key rules: jobs.CheckTarget applies it to a job's
// target. Errors are a *KeyError.
func ValidateKey(key string) error {
	if why := keyProblem(key); why != "" {
		return &KeyError{Key: key, Why: why}
	}
	return nil
}

// keyProblem returns what is wrong with key, or "".
func keyProblem(key string) string {
	switch {
	case key == "":
		return "must not be empty"
	case len(key) > MaxKeyLen:
		return fmt.Sprintf("is %d bytes, more than the %d allowed", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return "must be valid UTF-8"
	case strings.HasPrefix(key, "/"):
		return `must not start with "/"`
	}
	for _, r := range key {
		switch {
		case r == 0:
			return "must not contain NUL"
		case r == '\\':
			return `must not contain "\"`
		case r < 0x20 || r == 0x7f:
			return "must not contain control characters"
		}
	}
	for i, seg := range strings.Split(key, "/") {
		switch {
		case seg == "":
			return "must not contain an empty segment (\"//\" or a trailing \"/\")"
		case seg == "." || seg == "..":
			return fmt.Sprintf("must not contain a %q segment", seg)
		case len(seg) > MaxSegmentLen:
			return fmt.Sprintf("has a segment of %d bytes, more than the %d allowed", len(seg), MaxSegmentLen)
		case i == 0 && strings.EqualFold(seg, ReservedDir):
			// EqualFold: on a case-insensitive file system any spelling
			// lands in the reserved directory.
			return fmt.Sprintf("must not be under the reserved prefix %q", ReservedDir+"/")
		}
	}
	return ""
}
