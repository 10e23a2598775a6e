package worker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go/jetstream"
)

// maxKeptAttempts bounds the attempt reasons kept per job; the count goes on.
const maxKeptAttempts = 64

// attemptRecord is the value of a job's key in MIRROR_ATTEMPTS.
type attemptRecord struct {
	Count    int            `json:"count"`
	Attempts []jobs.Attempt `json:"attempts"`
}

// KV is the subset of jetstream.KeyValue the failure budget needs.
type KV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
}

var _ KV = (jetstream.KeyValue)(nil)

// attemptsKey maps a job id, and the replay run it is done for ("" for a
// live job), to a KV key. A replay's attempts are its own (issue 37): a
// live job and its replay copy, or the same job redone by a replay pacing
// its own requests, each keep their count and failure budget, so that
// neither dead-letters the other nor restarts its count. Job ids may hold
// ':' which KV keys may not; base64url keeps the mapping one-to-one. A run
// is a token (jobs.ValidReplayRun: checked at intake and in Options), a
// valid key part as it is.
func attemptsKey(run, id string) string {
	enc := base64.RawURLEncoding.EncodeToString([]byte(id))
	if run == "" {
		return "j." + enc
	}
	return "r." + run + "." + enc
}

// addAttempt records one failed attempt of job id (of replay run, "" for a
// live job) with compare-and-set, retrying on a concurrent update, and
// returns the record after it.
func addAttempt(ctx context.Context, kv KV, run, id string, a jobs.Attempt) (attemptRecord, error) {
	key := attemptsKey(run, id)
	var lastErr error
	for range 16 {
		var rec attemptRecord
		var rev uint64
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return attemptRecord{}, fmt.Errorf("get attempts %s: %w", id, err)
		default:
			rev = e.Revision()
			if json.Unmarshal(e.Value(), &rec) != nil {
				rec = attemptRecord{} // a damaged record restarts the count rather than wedging the job
			}
		}
		rec.Count++
		rec.Attempts = append(rec.Attempts, a)
		if len(rec.Attempts) > maxKeptAttempts {
			rec.Attempts = rec.Attempts[len(rec.Attempts)-maxKeptAttempts:]
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return attemptRecord{}, fmt.Errorf("encode attempts %s: %w", id, err)
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, b)
		} else {
			_, err = kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return attemptRecord{}, fmt.Errorf("store attempts %s: %w", id, err)
		}
		lastErr = err // another worker updated it: read again
	}
	return attemptRecord{}, fmt.Errorf("store attempts %s: %w", id, lastErr)
}

// getAttempts returns the record of job id of replay run ("" for a live
// job), empty when none.
func getAttempts(ctx context.Context, kv KV, run, id string) (attemptRecord, error) {
	var rec attemptRecord
	e, err := kv.Get(ctx, attemptsKey(run, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rec, nil
	}
	if err != nil {
		return rec, fmt.Errorf("get attempts %s: %w", id, err)
	}
	_ = json.Unmarshal(e.Value(), &rec)
	return rec, nil
}

// countReason is the attempts with reason.
func countReason(as []jobs.Attempt, reason string) int {
	n := 0
	for _, a := range as {
		if a.Reason == reason {
			n++
		}
	}
	return n
}
