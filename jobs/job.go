// Package jobs defines what travels on JetStream: the job format version 1
// and its validation, the subjects jobs, dead letters and pacer events are
// published on, the streams, the durable consumer and the KV bucket that
// carry them, and the publishing of jobs and dead-letter records.
//
// It knows nothing of HTTP or pacing: fetching a job is package fetch's
// business and deciding when is package pacer's. Like every package in this
// module it is not a stable public API.
package jobs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/textproto"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/mirror"
	"golang.org/x/net/http/httpguts"
)

// Version is the newest job format version this package understands.
// Version 2 adds the delete job ("op": "delete"); a fetch job is still
// written as version 1, so that a worker of an earlier version reads it,
// while a delete is written as version 2, so that such a worker refuses it
// (unsupported_version) rather than reading it as a fetch of the same URL.
const Version = 2

// Job operations (the "op" field). A job without "op" is a fetch.
const (
	// OpFetch copies the URL into the target key (the default).
	OpFetch = "fetch"
	// OpDelete removes the target key and leaves a tombstone
	// (docs/adr/0033-deletes-ordered-by-enqueue-time-and-tombstones.md).
	OpDelete = "delete"
)

// VersionOf is the format version a job with op is written as: 1 for a
// fetch, 2 for a delete.
func VersionOf(op string) int {
	if op == OpDelete {
		return 2
	}
	return 1
}

// Limits of the job format (docs/contract.md section 2), and the bounds this package adds
// so that no input can make validation expensive.
const (
	MaxURLLen    = 8 << 10 // bytes; a target's bound is mirror.MaxKeyLen
	MaxIDLen     = 128
	MaxTenantLen = 64
	// MaxJobLen bounds a whole job message. A valid job is far smaller
	// (URL 8 KiB, target 1 KiB, two short headers); the bound keeps the
	// duplicate-key scan and the dead-letter copy of a hostile message small.
	MaxJobLen = 64 << 10
	// MaxHeaderValueLen bounds one allowed request header value.
	MaxHeaderValueLen = 4096
)

// Defaults filled in by Parse.
const (
	DefaultTenant = "default"
	DefaultKind   = KindArtifact
)

// Job kinds: a metrics label only.
const (
	KindArtifact  = "artifact"
	KindMetadata  = "metadata"
	KindCompanion = "companion"
)

// ReservedPrefix is the top-level directory of a mirror target that belongs
// to mirrorworker itself (temporary files, metadata); no job may write there.
const ReservedPrefix = mirror.ReservedDir + "/"

// Job is one URL to copy into the mirror, as Parse returns it: validated,
// with every default filled in. Marshalling a parsed Job with encoding/json
// gives its canonical form (see Canonical), which Parse accepts unchanged.
// A Job is a plain value: safe to read from several goroutines, but its
// Headers map is shared by copies.
type Job struct {
	V       int               `json:"v,omitempty"`
	Op      string            `json:"op,omitempty"` // "" (a fetch) or OpDelete
	ID      string            `json:"id"`
	URL     string            `json:"url"`
	Target  string            `json:"target"`
	SHA256  string            `json:"sha256,omitempty"`
	Size    *int64            `json:"size,omitempty"`
	Tenant  string            `json:"tenant"`
	Kind    string            `json:"kind"`
	Headers map[string]string `json:"headers,omitempty"`
	// Authority is derived from URL by Parse; it is not part of the message.
	Authority authority.Authority `json:"-"`
}

// Error codes of an InvalidError; they double as dead-letter reason codes.
const (
	CodeInvalidJob         = "invalid_job"
	CodeUnsupportedVersion = "unsupported_version"
)

// InvalidError says why a job (or a job subject) is not acceptable. Such a
// job is never retried: the worker terminates it and dead-letters it with
// Code as the reason.
type InvalidError struct {
	Code  string // CodeInvalidJob or CodeUnsupportedVersion
	Field string // the JSON field at fault ("url", "headers", ...), or "" for the whole message
	Msg   string
}

func (e *InvalidError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Code: CodeInvalidJob, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// allowedHeaders maps the canonical name of every request header a job may
// set. Anything else could change what the origin sends (Range, cookies,
// authorisation) or how the worker is paced, so it is refused.
var allowedHeaders = map[string]bool{
	"Accept":          true,
	"Accept-Language": true,
}

// Parse decodes and validates one job message and fills in its defaults
// (docs/contract.md section 2). Unknown top-level fields are ignored; malformed JSON,
// duplicate keys (at any depth), a value of the wrong type and a broken rule
// are errors. A JSON null counts as an absent field. Every error is an
// *InvalidError; Parse never panics. With an error, the Job returned holds
// only the id, when the message carries a valid one, so that the dead
// letter of an invalid job names it.
func Parse(data []byte) (Job, error) {
	j, err := parse(data)
	if err != nil {
		return Job{ID: peekID(data)}, err
	}
	return j, nil
}

// peekID returns the "id" of a message that may be invalid in other ways,
// or "" when it has none that is valid. A hostile message gets no further
// than an id that passes the id rule.
func peekID(data []byte) string {
	if len(data) > MaxJobLen || !utf8.Valid(data) {
		return ""
	}
	var v struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(data, &v) != nil || !validID(v.ID) {
		return ""
	}
	return v.ID
}

func parse(data []byte) (Job, error) {
	if len(data) > MaxJobLen {
		return Job{}, invalid("", "job is %d bytes, more than the %d allowed", len(data), MaxJobLen)
	}
	if !utf8.Valid(data) {
		return Job{}, invalid("", "job is not valid UTF-8")
	}
	if err := checkJSON(data); err != nil {
		return Job{}, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Job{}, invalid("", "job must be a JSON object")
		}
		return Job{}, invalid("", "malformed JSON: %v", err)
	}
	if fields == nil { // null
		return Job{}, invalid("", "job must be a JSON object")
	}

	var j Job
	// The version comes first: a newer format may have other rules, so its
	// other fields are not judged by these.
	v := 0
	if raw, ok := present(fields, "v"); ok {
		var err error
		if v, err = checkVersion(raw); err != nil {
			return Job{}, err
		}
	}
	op, ok, err := stringField(fields, "op")
	if err != nil {
		return Job{}, err
	}
	switch {
	case !ok, op == OpFetch:
		op = ""
	case op == OpDelete:
		if v == 1 {
			return Job{}, invalid("op", "%q needs \"v\": 2 (a version 1 reader would fetch the URL instead)", OpDelete)
		}
		for _, f := range []string{"sha256", "size", "headers"} {
			if _, ok := present(fields, f); ok {
				return Job{}, invalid(f, "is not allowed on a delete job")
			}
		}
	default:
		return Job{}, invalid("op", "must be %q or %q", OpFetch, OpDelete)
	}
	j.Op, j.V = op, VersionOf(op)

	rawURL, ok, err := stringField(fields, "url")
	if err != nil {
		return Job{}, err
	}
	if !ok {
		return Job{}, invalid("url", "is required")
	}
	u, a, err := checkURL(rawURL)
	if err != nil {
		return Job{}, err
	}
	j.URL, j.Authority = rawURL, a

	target, ok, err := stringField(fields, "target")
	if err != nil {
		return Job{}, err
	}
	if ok {
		if msg := checkTarget(target); msg != "" {
			return Job{}, invalid("target", "%s", msg)
		}
	} else if target, err = defaultTarget(u, a); err != nil {
		return Job{}, err
	}
	j.Target = target

	id, ok, err := stringField(fields, "id")
	if err != nil {
		return Job{}, err
	}
	if ok {
		if !validID(id) {
			return Job{}, invalid("id", "must be 1 to %d characters from A-Z a-z 0-9 . _ : -", MaxIDLen)
		}
	} else if j.Op == OpDelete {
		id = DefaultDeleteID(j.URL, j.Target)
	} else {
		id = DefaultID(j.URL, j.Target)
	}
	j.ID = id

	sum, ok, err := stringField(fields, "sha256")
	if err != nil {
		return Job{}, err
	}
	if ok {
		if len(sum) != 64 || !isHex(sum) {
			return Job{}, invalid("sha256", "must be 64 hexadecimal digits")
		}
		j.SHA256 = strings.ToLower(sum)
	}

	if raw, ok := present(fields, "size"); ok {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
			return Job{}, invalid("size", "must be a non-negative integer")
		}
		j.Size = &n
	}

	tenant, ok, err := stringField(fields, "tenant")
	if err != nil {
		return Job{}, err
	}
	if !ok {
		tenant = DefaultTenant
	} else if !ValidTenant(tenant) {
		return Job{}, invalid("tenant", "must be 1 to %d characters from a-z 0-9 _ -", MaxTenantLen)
	}
	j.Tenant = tenant

	kind, ok, err := stringField(fields, "kind")
	if err != nil {
		return Job{}, err
	}
	switch {
	case !ok:
		kind = DefaultKind
	case kind == KindArtifact, kind == KindMetadata, kind == KindCompanion:
	default:
		return Job{}, invalid("kind", "must be %q, %q or %q", KindArtifact, KindMetadata, KindCompanion)
	}
	j.Kind = kind

	if raw, ok := present(fields, "headers"); ok {
		h, err := parseHeaders(raw)
		if err != nil {
			return Job{}, err
		}
		j.Headers = h
	}
	return j, nil
}

// Canonical returns the message body of the job: encoding/json's rendering
// of the struct, so fields come in a fixed order and header names sorted.
// Call it on a job returned by Parse; Publish and NewMsg do.
func (j Job) Canonical() ([]byte, error) {
	b, err := json.Marshal(j)
	if err != nil {
		return nil, fmt.Errorf("encode job: %w", err)
	}
	return b, nil
}

// DefaultID is the id of a job that does not give one: the first 32 hex
// digits of sha256(url + "\n" + target), so that enqueueing the same URL
// into the same target twice is deduplicated by JetStream.
func DefaultID(rawURL, target string) string {
	sum := sha256.Sum256([]byte(rawURL + "\n" + target))
	return hex.EncodeToString(sum[:])[:32]
}

// DefaultDeleteID is the id of a delete job that does not give one: like
// DefaultID, over "delete", a newline, url, a newline and target, so that a
// delete is never taken for a duplicate of the fetch of the same key.
func DefaultDeleteID(rawURL, target string) string {
	sum := sha256.Sum256([]byte(OpDelete + "\n" + rawURL + "\n" + target))
	return hex.EncodeToString(sum[:])[:32]
}

// IsDelete reports whether j is a delete job.
func (j Job) IsDelete() bool { return j.Op == OpDelete }

// present returns a field's raw value unless it is absent or null.
func present(fields map[string]json.RawMessage, name string) (json.RawMessage, bool) {
	raw, ok := fields[name]
	if !ok || string(raw) == "null" {
		return nil, false
	}
	return raw, true
}

func stringField(fields map[string]json.RawMessage, name string) (string, bool, error) {
	raw, ok := present(fields, name)
	if !ok {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, invalid(name, "must be a string")
	}
	return s, true, nil
}

// checkVersion returns the version raw gives, or why it is refused.
func checkVersion(raw json.RawMessage) (int, error) {
	var num json.Number // accepts a quoted number too, hence the check of raw[0]
	if err := json.Unmarshal(raw, &num); err != nil || raw[0] == '"' {
		return 0, invalid("v", "must be an integer")
	}
	s := string(num)
	if strings.ContainsAny(s, ".eE") {
		return 0, invalid("v", "must be an integer")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil && strings.HasPrefix(s, "-"), err == nil && n < 1:
		return 0, invalid("v", "must be 1 to %d", Version)
	case err != nil, n > Version: // a number too large for int64 is a (far) newer version too
		return 0, &InvalidError{Code: CodeUnsupportedVersion, Field: "v",
			Msg: fmt.Sprintf("version %s is newer than the supported version %d", Truncate(s, 32), Version)}
	}
	return int(n), nil
}

func checkURL(rawURL string) (*url.URL, authority.Authority, error) {
	if len(rawURL) > MaxURLLen {
		return nil, authority.Authority{}, invalid("url", "is %d bytes, more than the %d allowed", len(rawURL), MaxURLLen)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the whole URL, which may be 8 KiB; its Err is the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, authority.Authority{}, invalid("url", "cannot be parsed: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, authority.Authority{}, invalid("url", "must be an absolute http or https URL")
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, authority.Authority{}, invalid("url", "must be an absolute http or https URL with a host")
	}
	if u.User != nil {
		return nil, authority.Authority{}, invalid("url", "must not contain userinfo (user:password@)")
	}
	a, err := authority.FromURL(u)
	if err != nil {
		return nil, authority.Authority{}, invalid("url", "%v", err)
	}
	return u, a, nil
}

// defaultTarget derives <host>/<path> ("<host>_<port>/<path>" for a port that
// is not the scheme's default, "index" for a path ending in "/") from the
// decoded path, then checks it by the rules of an explicit target: a path
// such as /a/%2e%2e/b decodes to a ".." segment and is refused rather than
// escaping the host's directory.
func defaultTarget(u *url.URL, a authority.Authority) (string, error) {
	if u.RawQuery != "" {
		return "", invalid("target", "is required for a URL with a query string")
	}
	host := a.Host
	if (u.Scheme == "http" && a.Port != "80") || (u.Scheme == "https" && a.Port != "443") {
		host += "_" + a.Port
	}
	p := u.Path
	if p == "" {
		p = "/"
	}
	if strings.HasSuffix(p, "/") {
		p += "index"
	}
	t := host + p
	if msg := checkTarget(t); msg != "" {
		return "", invalid("target", "the default %q derived from the url %s; give an explicit target", Truncate(t, 200), msg)
	}
	return t, nil
}

// CheckTarget reports whether key is an acceptable mirror target key, by
// the mirror's own rules (mirror.ValidateKey): at most 1024 bytes of UTF-8,
// "/"-separated, no empty, "." or ".." segment, no segment longer than
// mirror.MaxSegmentLen, no leading "/", no backslash, NUL or other control
// character, and not under ReservedPrefix (compared without regard to
// case, for case-insensitive file systems). The error is an *InvalidError
// for field "target".
func CheckTarget(key string) error {
	if msg := checkTarget(key); msg != "" {
		return invalid("target", "%s", msg)
	}
	return nil
}

// checkTarget returns what is wrong with t, or "".
func checkTarget(t string) string {
	var ke *mirror.KeyError
	if errors.As(mirror.ValidateKey(t), &ke) {
		return ke.Why
	}
	return ""
}

func parseHeaders(raw json.RawMessage) (map[string]string, error) {
	var in map[string]string
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, invalid("headers", "must be an object of string values")
	}
	names := make([]string, 0, len(in))
	for k := range in {
		names = append(names, k)
	}
	sort.Strings(names) // the same input always gives the same error
	out := make(map[string]string, len(in))
	for _, name := range names {
		v := in[name]
		canon := textproto.CanonicalMIMEHeaderKey(name)
		if !httpguts.ValidHeaderFieldName(name) || !allowedHeaders[canon] {
			return nil, invalid("headers", "%q is not allowed (only Accept and Accept-Language)", Truncate(name, 64))
		}
		if _, dup := out[canon]; dup {
			return nil, invalid("headers", "%q is given twice", canon)
		}
		if len(v) > MaxHeaderValueLen || !httpguts.ValidHeaderFieldValue(v) {
			return nil, invalid("headers", "%s value must be at most %d bytes without control characters", canon, MaxHeaderValueLen)
		}
		out[canon] = v
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// checkJSON reports malformed JSON and duplicate object keys at any depth.
// encoding/json silently keeps the last of two equal keys, so a job
// {"url": A, "url": B} would mean different things to different readers.
//
// Every job goes through it, so well-formed JSON takes a scan that
// allocates nothing for keys without escapes (duplicateKeys, after
// json.Valid); only malformed JSON takes the tokenizer (checkJSONTokens),
// whose error says what is wrong. Both find the same duplicates:
// TestCheckJSONAgreesWithTheTokenizer.
func checkJSON(data []byte) error {
	if !json.Valid(data) {
		return checkJSONTokens(data)
	}
	return duplicateKeys(data)
}

// checkJSONTokens is checkJSON by encoding/json's tokenizer, which
// decodes every token (an allocation each).
func checkJSONTokens(data []byte) error {
	type frame struct {
		keys    map[string]bool // nil for an array
		wantKey bool
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return invalid("", "malformed JSON: %v", err)
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			if k, ok := tok.(string); ok {
				top := stack[n-1]
				if top.keys[k] {
					return invalid("", "malformed JSON: duplicate key %q", Truncate(k, 64))
				}
				top.keys[k] = true
				top.wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			valueDone()
		default:
			valueDone()
		}
	}
}

// smallObject is how many keys an object's duplicates are looked for
// among by comparison; past it, in a map (a hostile 64 KiB job can have
// thousands of keys).
const smallObject = 16

// duplicateKeys reports the first duplicate object key in data, which
// must be valid JSON (json.Valid), as checkJSONTokens would. Keys are
// compared decoded: "url" and "\u0075rl" are the same key.
func duplicateKeys(data []byte) error {
	type frame struct {
		object  bool
		wantKey bool
		first   int             // this object's first key in keys
		seen    map[string]bool // its keys, once it has more than smallObject
	}
	var (
		stackBuf [8]frame
		keysBuf  [2 * smallObject][]byte
	)
	stack, keys := stackBuf[:0], keysBuf[:0]
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{':
			stack = append(stack, frame{object: true, wantKey: true, first: len(keys)})
		case '[':
			stack = append(stack, frame{})
		case '}', ']':
			if top := stack[len(stack)-1]; top.object {
				keys = keys[:top.first]
			}
			stack = stack[:len(stack)-1]
		case ',':
			if top := &stack[len(stack)-1]; top.object {
				top.wantKey = true
			}
		case '"':
			start, escaped := i+1, false
			for i++; data[i] != '"'; i++ {
				if data[i] == '\\' {
					escaped = true
					i++ // the escaped byte, a quote perhaps
				}
			}
			if len(stack) == 0 { // the whole document is a string
				continue
			}
			top := &stack[len(stack)-1]
			if !top.object || !top.wantKey {
				continue
			}
			top.wantKey = false
			k := data[start:i]
			if escaped {
				var s string
				if err := json.Unmarshal(data[start-1:i+1], &s); err != nil {
					return invalid("", "malformed JSON: %v", err)
				}
				k = []byte(s)
			}
			if top.seen == nil && len(keys)-top.first < smallObject {
				if slices.ContainsFunc(keys[top.first:], func(x []byte) bool { return bytes.Equal(x, k) }) {
					return invalid("", "malformed JSON: duplicate key %q", Truncate(string(k), 64))
				}
				keys = append(keys, k)
				continue
			}
			if top.seen == nil {
				top.seen = make(map[string]bool, 2*smallObject)
				for _, k := range keys[top.first:] {
					top.seen[string(k)] = true
				}
			}
			if top.seen[string(k)] {
				return invalid("", "malformed JSON: duplicate key %q", Truncate(string(k), 64))
			}
			top.seen[string(k)] = true
		}
	}
	return nil
}

func validID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// ValidTenant reports whether s is a tenant name: 1 to 64 characters from
// a-z, 0-9, "_" and "-". Such a name is a valid NATS subject token.
func ValidTenant(s string) bool {
	return len(s) <= MaxTenantLen && tokenChars(s)
}

// tokenChars reports whether s is non-empty and made only of a-z, 0-9, "_"
// and "-": the characters of tenants and authority keys, all safe in a NATS
// subject token.
func tokenChars(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// Truncate shortens s to its first n bytes, cut back to a rune boundary so
// that it never splits UTF-8, and marks the cut with "..."; s itself when it
// is no longer than n. It is the one truncation for text put into job
// records (Attempt.Detail, DeadLetter.Detail), errors and log fields.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
