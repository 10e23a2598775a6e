package mirror_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
)

func TestSupersedes(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name           string
		later, earlier time.Time
		want           bool
	}{
		{name: "later", later: t0.Add(time.Nanosecond), earlier: t0, want: true},
		{name: "same instant", later: t0, earlier: t0},
		{name: "earlier", later: t0, earlier: t0.Add(time.Second)},
		{name: "later unknown", earlier: t0},
		{name: "earlier unknown", later: t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mirror.Supersedes(tc.later, tc.earlier); got != tc.want {
				t.Errorf("Supersedes(%v, %v) = %v, want %v", tc.later, tc.earlier, got, tc.want)
			}
		})
	}
}

// A delete leaves no object and no metadata, and a tombstone that Stat
// does not mistake for the object; a second Put and ClearTombstone bring
// the key back.
func TestFileDeleteLeavesTombstone(t *testing.T) {
	for _, sidecar := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "sidecar"}[sidecar], func(t *testing.T) {
			ctx := context.Background()
			ft := openWith(t, &mirror.Options{Sidecar: sidecar})
			enq := time.Date(2026, 12, 3, 10, 0, 0, 5, time.UTC)
			stored, err := ft.Put(ctx, "h/a.txt", strings.NewReader("hello"), mirror.Expect{}, mirror.Meta{URL: "http://h/a.txt", JobID: "f1", Enqueued: enq})
			if err != nil {
				t.Fatal(err)
			}
			if m, err := ft.Stat(ctx, "h/a.txt"); err != nil || !m.Enqueued.Equal(enq) {
				t.Fatalf("Stat = %+v, %v; want enqueued %v", m, err, enq)
			}
			if _, err := ft.Tombstone(ctx, "h/a.txt"); !errors.Is(err, mirror.ErrNotFound) {
				t.Fatalf("Tombstone before the delete: %v, want ErrNotFound", err)
			}
			del := mirror.Tombstone{URL: "http://u:p@h/a.txt", JobID: "d1", Enqueued: enq.Add(time.Second), DeletedAt: enq.Add(2 * time.Second)}
			if err := ft.Delete(ctx, "h/a.txt", del); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(ft.Root(), "h", "a.txt")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("object still there: %v", err)
			}
			if _, err := ft.Stat(ctx, "h/a.txt"); !errors.Is(err, mirror.ErrNotFound) {
				t.Errorf("Stat after delete: %v, want ErrNotFound", err)
			}
			ts, err := ft.Tombstone(ctx, "h/a.txt")
			if err != nil {
				t.Fatal(err)
			}
			want := mirror.Tombstone{Key: "h/a.txt", URL: "http://h/a.txt", JobID: "d1", Enqueued: del.Enqueued,
				DeletedAt: del.DeletedAt, SHA256: stored.SHA256, Size: 5}
			if ts != want {
				t.Errorf("tombstone\n got %+v\nwant %+v", ts, want)
			}
			var listed []string
			if err := ft.List(ctx, func(k string) error { listed = append(listed, k); return nil }); err != nil || len(listed) != 0 {
				t.Errorf("List after delete = %v, %v; want nothing (tombstones are the target's own files)", listed, err)
			}
			var tombs []mirror.Tombstone
			if err := ft.ListTombstones(ctx, func(ts mirror.Tombstone) error { tombs = append(tombs, ts); return nil }); err != nil || len(tombs) != 1 || tombs[0] != want {
				t.Errorf("ListTombstones = %+v, %v", tombs, err)
			}
			// Deleting again (a redelivery) keeps one tombstone, of nothing.
			if err := ft.Delete(ctx, "h/a.txt", del); err != nil {
				t.Fatal(err)
			}
			if ts, _ := ft.Tombstone(ctx, "h/a.txt"); ts.SHA256 != "" || ts.JobID != "d1" {
				t.Errorf("tombstone of a second delete %+v", ts)
			}
			if _, err := ft.Put(ctx, "h/a.txt", strings.NewReader("again"), mirror.Expect{}, mirror.Meta{JobID: "f2"}); err != nil {
				t.Fatal(err)
			}
			if err := ft.ClearTombstone(ctx, "h/a.txt"); err != nil {
				t.Fatal(err)
			}
			if _, err := ft.Tombstone(ctx, "h/a.txt"); !errors.Is(err, mirror.ErrNotFound) {
				t.Errorf("Tombstone after clear: %v", err)
			}
			if err := ft.ClearTombstone(ctx, "h/a.txt"); err != nil {
				t.Errorf("ClearTombstone of none: %v", err)
			}
		})
	}
}

func TestFileDeleteRefusesBadKeys(t *testing.T) {
	ft := open(t)
	for _, key := range []string{"../x", ".mirrorworker/tombstones/x", ""} {
		if err := ft.Delete(context.Background(), key, mirror.Tombstone{}); !errors.Is(err, mirror.ErrInvalidKey) {
			t.Errorf("Delete(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
}

func TestListTombstonesOfNone(t *testing.T) {
	ft := open(t)
	n := 0
	if err := ft.ListTombstones(context.Background(), func(mirror.Tombstone) error { n++; return nil }); err != nil || n != 0 {
		t.Errorf("ListTombstones = %d, %v", n, err)
	}
}

// BenchmarkTombstoneMiss is what every store of a file target now pays
// before its Put: the lookup of a tombstone that is not there.
func BenchmarkTombstoneMiss(b *testing.B) {
	ft := open(b)
	ctx := context.Background()
	for b.Loop() {
		if _, err := ft.Tombstone(ctx, "h/pkg/some-artifact-1.2.3.tar.gz"); !errors.Is(err, mirror.ErrNotFound) {
			b.Fatal(err)
		}
	}
}
