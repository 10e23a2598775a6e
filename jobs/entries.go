package jobs

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go/jetstream"
)

// Entries decodes every value of kv as a T: the pods of PodsBucket, the
// leases of LeasesBucket, the runs of ReplaysBucket. A key deleted or
// expired between the listing and its read, or a value that is not a T,
// is left out; only the listing itself can fail.
func Entries[T any](ctx context.Context, kv jetstream.KeyValue) ([]T, error) {
	es, err := Revisions[T](ctx, kv)
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

// Revisions is Entries with each value's key and revision.
func Revisions[T any](ctx context.Context, kv jetstream.KeyValue) ([]Entry[T], error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []Entry[T]
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // gone meanwhile
		}
		var v T
		if json.Unmarshal(e.Value(), &v) == nil {
			out = append(out, Entry[T]{Key: k, Revision: e.Revision(), Value: v})
		}
	}
	return out, nil
}
