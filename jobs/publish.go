package jobs

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NewMsg validates j as Parse would (so a Job built by hand gets its
// defaults, an empty field meaning the default, and cannot put an invalid
// job on the stream) and returns the
// message that carries it: subject mirror.jobs.<tenant>.<akey>, header
// Nats-Msg-Id set to the job id, body the canonical JSON of the job. The
// returned Job is the normalised one.
func NewMsg(j Job) (*nats.Msg, Job, error) {
	b, err := json.Marshal(sparseJob{
		V: j.V, Op: j.Op, ID: j.ID, URL: j.URL, Target: j.Target, SHA256: j.SHA256,
		Size: j.Size, Tenant: j.Tenant, Kind: j.Kind, Headers: j.Headers,
	})
	if err != nil {
		return nil, Job{}, fmt.Errorf("encode job: %w", err)
	}
	nj, err := Parse(b)
	if err != nil {
		return nil, Job{}, err
	}
	if b, err = nj.Canonical(); err != nil {
		return nil, Job{}, err
	}
	m := nats.NewMsg(nj.Subject())
	m.Header.Set(jetstream.MsgIDHeader, nj.ID)
	m.Data = b
	return m, nj, nil
}

// Publish publishes j (see NewMsg) and waits for the stream's ack. A job
// whose id the stream saw within its duplicate window is not stored again;
// that is not an error: the ack reports it in PubAck.Duplicate.
func Publish(ctx context.Context, js jetstream.JetStream, j Job) (*jetstream.PubAck, error) {
	m, nj, err := NewMsg(j)
	if err != nil {
		return nil, err
	}
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("publish job %s: %w", nj.ID, err)
	}
	return ack, nil
}

// sparseJob is Job with every field optional, so that a field left empty in
// a Job built by hand is absent, and Parse fills in its default.
type sparseJob struct {
	V       int               `json:"v,omitempty"`
	Op      string            `json:"op,omitempty"`
	ID      string            `json:"id,omitempty"`
	URL     string            `json:"url,omitempty"`
	Target  string            `json:"target,omitempty"`
	SHA256  string            `json:"sha256,omitempty"`
	Size    *int64            `json:"size,omitempty"`
	Tenant  string            `json:"tenant,omitempty"`
	Kind    string            `json:"kind,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}
