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
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []T
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // gone meanwhile
		}
		var v T
		if json.Unmarshal(e.Value(), &v) == nil {
			out = append(out, v)
		}
	}
	return out, nil
}
