package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Entries decodes every value of kv as a T: the pods of PodsBucket, the
// leases of LeasesBucket, the runs of ReplaysBucket. js is the JetStream
// kv belongs to. A key deleted or expired between the listing and its
// read, or a value that is not a T, is left out; the listing or a read
// that fails otherwise is an error.
func Entries[T any](ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) ([]T, error) {
	es, err := Revisions[T](ctx, js, kv)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(es))
	for _, e := range es {
		out = append(out, e.Value)
	}
	return out, nil
}

// Entry is a decoded value of a bucket with its key and revision.
type Entry[T any] struct {
	Key      string
	Revision uint64
	Value    T
}

// Revisions is Entries with each value's key and revision, in key order.
//
// The keys are the subjects of the bucket's stream, read in one request
// (the stream's state), not kv.ListKeys: that watcher ends its listing
// when a delivery says nothing is pending, which misses a key whose old
// value was replaced after the listing began and whose new one was stored
// after that delivery (TestEntriesMissNoKeyBeingUpdated: 108 listings of
// 400 missed one of five keys being rewritten). A lone replay then went on
// without spacing its first requests from the last starts of the replay
// it had waited for, whose ended entry was being written as it listed; a
// refresh of that entry while it still paced would have let both pace.
func Revisions[T any](ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) ([]Entry[T], error) {
	keys, err := keysOf(ctx, js, kv)
	if err != nil {
		return nil, err
	}
	var out []Entry[T]
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			continue // deleted (its last message is the delete), or gone meanwhile
		case err != nil:
			return nil, fmt.Errorf("read %s in %s: %w", k, kv.Bucket(), err)
		}
		var v T
		if json.Unmarshal(e.Value(), &v) == nil {
			out = append(out, Entry[T]{Key: k, Revision: e.Revision(), Value: v})
		}
	}
	return out, nil
}

// keysOf lists the keys of kv (a bucket of js) that have a message, in
// order: its stream's subjects, read in one request, so that a key being
// rewritten meanwhile is listed (Revisions says why kv.ListKeys is not
// used). A key whose last message is its deletion is listed too: a read
// of it finds it deleted.
func keysOf(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) ([]string, error) {
	prefix := "$KV." + kv.Bucket() + "."
	s, err := js.Stream(ctx, "KV_"+kv.Bucket())
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subj, prefix))
	}
	slices.Sort(keys)
	return keys, nil
}
