package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Dead-letter reason codes. They are stable: operators alert and filter on
// them. An HTTP status that ends a job is HTTPReason(status), e.g. http_404.
const (
	ReasonInvalidJob         = CodeInvalidJob         // the job breaks a rule of the format
	ReasonUnsupportedVersion = CodeUnsupportedVersion // the job's v is newer than this worker
	ReasonBudgetExhausted    = "budget_exhausted"     // transient failures used up the budget
	ReasonDestinationRefused = "destination_refused"  // a hop resolved to a refused address
	ReasonTooManyRedirects   = "too_many_redirects"
	ReasonBodyTooLarge       = "body_too_large"
	ReasonAuthFailed         = "auth_failed"      // 401/403: the origin refuses the credential (worker.AuthRule)
	ReasonContentMismatch    = "content_mismatch" // the origin answered, twice, with other bytes than the job's size or sha256
	ReasonInvalidTarget      = "invalid_target"   // the mirror refused the job's target key
	ReasonTargetConflict     = "target_conflict"  // an object stands where the key needs a directory, or the reverse
	ReasonReplayTarget       = "replay_target"    // a pod may not write the target a replay job names (run --replay-target)
	// Reasons of failed attempts the worker retries against the budget
	// (besides fetch.ReasonCode's transport codes and HTTPReason of a 5xx).
	ReasonSizeMismatch   = "size_mismatch"   // other bytes than the job's size
	ReasonDigestMismatch = "digest_mismatch" // other bytes than the job's sha256
	ReasonTargetWrite    = "target_write"    // the mirror failed to store the object for another cause
	// ReasonDeleteUnsupported: a delete job for a target that keeps no
	// tombstones (only file and S3 targets do).
	ReasonDeleteUnsupported = "delete_unsupported"
)

// HTTPReason returns the reason code of a permanent HTTP status: "http_404".
func HTTPReason(status int) string { return "http_" + strconv.Itoa(status) }

// ThrottledReason is the reason of a throttling answer kept among a dead
// letter's attempts (it never counts against the budget): "throttled_429".
func ThrottledReason(status int) string { return "throttled_" + strconv.Itoa(status) }

// MaxDeadLetterJob bounds the copy of the original message kept in a dead
// letter; a longer message (only a hostile or broken producer sends one) is
// truncated so the record always fits in a NATS message.
const MaxDeadLetterJob = MaxJobLen

// DeadLetter is the record published to mirror.dlq.<tenant>.<akey> when a
// job leaves the system without being stored (docs/contract.md section 6). It is a
// plain value with no concurrency of its own.
type DeadLetter struct {
	// Job is the original message body when it is valid JSON, unchanged.
	Job json.RawMessage `json:"job,omitempty"`
	// JobBytes is the original body when it is not valid UTF-8 JSON
	// (base64 in the record); Job is then empty.
	JobBytes []byte `json:"job_bytes,omitempty"`
	// JobTruncated says the original was longer than MaxDeadLetterJob and
	// JobBytes holds only its beginning; JobLen is the original length.
	JobTruncated bool `json:"job_truncated,omitempty"`
	JobLen       int  `json:"job_len,omitempty"`

	JobID     string `json:"job_id,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	Authority string `json:"authority,omitempty"`  // "host:port"
	Subject   string `json:"subject,omitempty"`    // the subject the job arrived on
	StreamSeq uint64 `json:"stream_seq,omitempty"` // its sequence in MIRROR_JOBS

	Reason     string    `json:"reason"` // a stable code: Reason*, HTTPReason
	Detail     string    `json:"detail,omitempty"`
	LastStatus int       `json:"last_status,omitempty"` // last HTTP status, 0 if none
	Attempts   []Attempt `json:"attempts,omitempty"`
	First      time.Time `json:"first,omitzero"` // first attempt (or delivery)
	Last       time.Time `json:"last,omitzero"`  // when the job was given up
	Worker     string    `json:"worker,omitempty"`
	// Replay is the replay run of a replay job (HeaderReplay) a pod gave
	// up: its record goes to ReplayDLQStream, not MIRROR_DLQ.
	Replay string `json:"replay,omitempty"`
}

// Attempt is one failed attempt at a job.
type Attempt struct {
	Time   time.Time `json:"time"`
	Reason string    `json:"reason"`
	Status int       `json:"status,omitempty"`
	Detail string    `json:"detail,omitempty"`
}

// SetJob stores the original message body in d, as Job when it is valid
// JSON and otherwise (or when it is too long) as JobBytes.
func (d *DeadLetter) SetJob(data []byte) {
	d.Job, d.JobBytes, d.JobTruncated, d.JobLen = nil, nil, false, len(data)
	switch {
	case len(data) > MaxDeadLetterJob:
		d.JobBytes = append([]byte(nil), data[:MaxDeadLetterJob]...)
		d.JobTruncated = true
	case utf8.Valid(data) && json.Valid(data):
		d.Job = append(json.RawMessage(nil), data...)
	default:
		d.JobBytes = append([]byte(nil), data...)
	}
}

// subject returns the dead-letter subject of d: its tenant and authority,
// else the tokens of the subject the job arrived on, else InvalidToken.
func (d DeadLetter) subject() string {
	tenant, akey := d.Tenant, ""
	if d.Authority != "" {
		akey = authority.KeyOf(d.Authority)
	}
	if rest, ok := strings.CutPrefix(d.Subject, JobsSubjectPrefix); ok {
		st, sa, _ := strings.Cut(rest, ".")
		sa, _, _ = strings.Cut(sa, ".") // stored subjects end with the partition
		if !ValidTenant(tenant) {
			tenant = st
		}
		if !validAkey(akey) {
			akey = sa
		}
	}
	subj := DeadLetterSubject(tenant, akey) // replaces what is still invalid
	if d.Replay != "" {
		return ReplayDLQPrefix + strings.TrimPrefix(subj, DLQSubjectPrefix)
	}
	return subj
}

// msgID derives the dead letter's Nats-Msg-Id from the job id (or a digest
// of the original message) and the job's stream sequence, so that retrying
// the publish of one dead letter stores it once, while the same job
// enqueued again later and dead-lettered again gets its own record.
func (d DeadLetter) msgID() string {
	id := d.JobID
	if !validID(id) {
		sum := sha256.New()
		sum.Write(d.Job)
		sum.Write(d.JobBytes)
		id = "sha256-" + hex.EncodeToString(sum.Sum(nil))[:32]
	}
	return "dlq:" + id + ":" + strconv.FormatUint(d.StreamSeq, 10)
}

// PublishDeadLetter publishes d to its dead-letter subject and waits for the
// ack. d.Job must hold the original body, set with SetJob when it may not be
// valid JSON. A retried publish of the same record (same job id and stream
// sequence) within the duplicate window is stored once.
func PublishDeadLetter(ctx context.Context, js jetstream.JetStream, d DeadLetter) (*jetstream.PubAck, error) {
	if len(d.Job) > 0 && (len(d.Job) > MaxDeadLetterJob || !utf8.Valid(d.Job) || !json.Valid(d.Job)) {
		d.SetJob(d.Job) // a caller put something that is not JSON in Job: keep it as bytes
	}
	if d.Reason == "" {
		return nil, fmt.Errorf("publish dead letter %s: empty reason", d.JobID)
	}
	b, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("publish dead letter %s: %w", d.JobID, err)
	}
	m := nats.NewMsg(d.subject())
	m.Header.Set(jetstream.MsgIDHeader, d.msgID())
	m.Data = b
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("publish dead letter %s: %w", d.JobID, err)
	}
	return ack, nil
}
