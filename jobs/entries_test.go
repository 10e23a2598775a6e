package jobs_test

import (
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// TestEntriesDecodesWhatIsThere: every value that is a T, none that was
// deleted or is not one.
func TestEntriesDecodesWhatIsThere(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ENTRIES_TEST"})
	if err != nil {
		t.Fatal(err)
	}
	type pod struct {
		Pod string `json:"pod"`
	}
	for k, v := range map[string]string{"a": `{"pod":"a"}`, "b": `{"pod":"b"}`, "gone": `{"pod":"gone"}`, "bad": `not json`} {
		if _, err := kv.PutString(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	got, err := jobs.Entries[pod](ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, p.Pod)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a", "b"}) {
		t.Errorf("Entries = %v, want [a b]", names)
	}
}
