package bucket_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

// The S3 target keeps the same tombstone as a file target, as an object
// under the reserved prefix that List does not show.
func TestDeleteLeavesTombstone(t *testing.T) {
	srv := buckettest.Start(t)
	srv.CreateBucket(t, "mirror")
	tg := open(t, srv, "s3://mirror/pre", nil)
	ctx := ctxT(t)
	enq := time.Date(2026, 12, 3, 10, 0, 0, 7, time.UTC)
	stored, err := tg.Put(ctx, "h/a.txt", strings.NewReader("hello"), mirror.Expect{}, mirror.Meta{URL: "http://h/a.txt", JobID: "f1", FetchedAt: enq, Enqueued: enq})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := tg.Stat(ctx, "h/a.txt"); err != nil || !m.Enqueued.Equal(enq) {
		t.Fatalf("Stat = %+v, %v; want enqueued %v", m, err, enq)
	}
	del := mirror.Tombstone{URL: "http://h/a.txt", JobID: "d1", Enqueued: enq.Add(time.Second), DeletedAt: enq.Add(2 * time.Second)}
	if err := tg.Delete(ctx, "h/a.txt", del); err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Stat(ctx, "h/a.txt"); !errors.Is(err, mirror.ErrNotFound) {
		t.Errorf("Stat after delete: %v, want ErrNotFound", err)
	}
	ts, err := tg.Tombstone(ctx, "h/a.txt")
	want := mirror.Tombstone{Key: "h/a.txt", URL: "http://h/a.txt", JobID: "d1", Enqueued: del.Enqueued, DeletedAt: del.DeletedAt, SHA256: stored.SHA256, Size: 5}
	if err != nil || ts != want {
		t.Fatalf("Tombstone = %+v, %v\nwant %+v", ts, err, want)
	}
	var listed []string
	if err := tg.List(ctx, func(k string) error { listed = append(listed, k); return nil }); err != nil || len(listed) != 0 {
		t.Errorf("List after delete = %v, %v", listed, err)
	}
	var tombs []mirror.Tombstone
	if err := tg.ListTombstones(ctx, func(ts mirror.Tombstone) error { tombs = append(tombs, ts); return nil }); err != nil || len(tombs) != 1 || tombs[0] != want {
		t.Errorf("ListTombstones = %+v, %v", tombs, err)
	}
	if err := tg.ClearTombstone(ctx, "h/a.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Tombstone(ctx, "h/a.txt"); !errors.Is(err, mirror.ErrNotFound) {
		t.Errorf("Tombstone after clear: %v", err)
	}
}
