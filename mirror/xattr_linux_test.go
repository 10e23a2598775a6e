package mirror_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/mirrorworker/mirrorworker/mirror"
)

const xattrName = "user.mirrorworker.meta"

func setMetaXattr(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := unix.Setxattr(path, xattrName, data, 0); err != nil {
		t.Fatal(err)
	}
}

// metaXattr returns path's metadata attribute, or nil without one.
func metaXattr(t *testing.T, path string) []byte {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Getxattr(path, xattrName, buf)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// xattrTarget opens a target that keeps metadata in attributes. Where the
// file system under t.TempDir has none, the test is skipped (failed under
// CI=true), with a line for `make test` to print (MW_SKIPPED_FILE).
func xattrTarget(t *testing.T) *mirror.FileTarget {
	t.Helper()
	ft := open(t)
	needXattrs(t, ft)
	return ft
}

func needXattrs(t *testing.T, ft *mirror.FileTarget) {
	t.Helper()
	if ft.MetadataInXattrs() {
		return
	}
	msg := fmt.Sprintf("%s skipped: %s has no user extended attributes; run with TMPDIR on ext4, XFS or btrfs", t.Name(), ft.Root())
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	if f := os.Getenv("MW_SKIPPED_FILE"); f != "" {
		if fh, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(fh, "mirror: "+msg)
			fh.Close()
		}
	}
	t.Skip(msg)
}

// TestMetadataIsTheObjectsAttribute: the metadata is an attribute of the
// object file, so no sidecar is written, and nothing under meta/ appears.
func TestMetadataIsTheObjectsAttribute(t *testing.T) {
	ft := xattrTarget(t)
	ctx := context.Background()
	m, err := ft.Put(ctx, "h/a", strings.NewReader("abc"), mirror.Expect{}, mirror.Meta{ETag: `"1"`, JobID: "j1"})
	if err != nil {
		t.Fatal(err)
	}
	var got mirror.Meta
	if err := json.Unmarshal(metaXattr(t, filepath.Join(ft.Root(), "h", "a")), &got); err != nil {
		t.Fatal(err)
	}
	if got.ETag != `"1"` || got.SHA256 != m.SHA256 || got.Size != 3 || got.JobID != "j1" {
		t.Errorf("attribute holds %+v", got)
	}
	if entries, err := os.ReadDir(filepath.Join(ft.Root(), ".mirrorworker", "meta")); err != nil || len(entries) != 0 {
		t.Errorf("meta/ holds %v, %v; want nothing", entries, err)
	}
}

// TestReadsAndReplacesSidecarsOfEarlierVersions: a root written by an
// earlier version (sidecar files) keeps its metadata under a version that
// writes attributes, and an overwrite removes the old sidecar, so a reader
// that only knows sidecars never pairs it with the new bytes.
func TestReadsAndReplacesSidecarsOfEarlierVersions(t *testing.T) {
	root := t.TempDir()
	ctx := context.Background()
	old, err := mirror.OpenWith(root, &mirror.Options{Sidecar: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"h/old", "h/kept"} {
		if _, err := old.Put(ctx, key, strings.NewReader("version 1"), mirror.Expect{}, mirror.Meta{ETag: `"v1"`}); err != nil {
			t.Fatal(err)
		}
	}
	sidecar := filepath.Join(root, ".mirrorworker", "meta", "h", "old.json")
	if _, err := os.Stat(sidecar); err != nil {
		t.Fatalf("the earlier layout has no sidecar: %v", err)
	}
	ft, err := mirror.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	needXattrs(t, ft)
	for _, key := range []string{"h/old", "h/kept"} {
		if m, err := ft.Stat(ctx, key); err != nil || m.ETag != `"v1"` {
			t.Errorf("Stat(%q) of an earlier version's object: %+v, %v", key, m, err)
		}
	}
	if _, err := ft.Put(ctx, "h/old", strings.NewReader("version 2"), mirror.Expect{}, mirror.Meta{ETag: `"v2"`}); err != nil {
		t.Fatal(err)
	}
	if m, err := ft.Stat(ctx, "h/old"); err != nil || m.ETag != `"v2"` {
		t.Errorf("Stat after the overwrite: %+v, %v", m, err)
	}
	if _, err := os.Stat(sidecar); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old sidecar is still there (%v): an earlier version would trust it for the new bytes", err)
	}
	if metaXattr(t, filepath.Join(root, "h", "old")) == nil {
		t.Error("the new object has no attribute")
	}
}

// TestMetadataTooLargeForAnAttribute: metadata the file system cannot hold
// as an attribute goes to a sidecar (a URL of 6 KiB: ext4 says ENOSPC past
// its inode and one block; of 100 KiB: E2BIG past Linux's 64 KiB limit); a
// later small one goes back to the attribute, and the sidecar goes.
func TestMetadataTooLargeForAnAttribute(t *testing.T) {
	for _, size := range []int{6 << 10, 100 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			ft := xattrTarget(t)
			ctx := context.Background()
			long := "https://h.example/" + strings.Repeat("x", size)
			if _, err := ft.Put(ctx, "h/big", strings.NewReader("abc"), mirror.Expect{}, mirror.Meta{URL: long}); err != nil {
				t.Fatal(err)
			}
			m, err := ft.Stat(ctx, "h/big")
			if err != nil || m.URL != long {
				t.Fatalf("Stat of an object with large metadata: URL of %d bytes, %v", len(m.URL), err)
			}
			sidecar := filepath.Join(ft.Root(), ".mirrorworker", "meta", "h", "big.json")
			if _, err := os.Stat(sidecar); err != nil {
				if metaXattr(t, filepath.Join(ft.Root(), "h", "big")) != nil {
					t.Skipf("this file system holds %d bytes of attribute: no fallback needed", size)
				}
				t.Fatalf("no sidecar and no attribute: %v", err)
			}
			if _, err := ft.Put(ctx, "h/big", bytes.NewReader([]byte("abcd")), mirror.Expect{}, mirror.Meta{URL: "https://h.example/small"}); err != nil {
				t.Fatal(err)
			}
			if m, err := ft.Stat(ctx, "h/big"); err != nil || m.URL != "https://h.example/small" || m.Size != 4 {
				t.Errorf("Stat after a small overwrite: %+v, %v", m, err)
			}
			if _, err := os.Stat(sidecar); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the sidecar outlived its object: %v", err)
			}
		})
	}
}

// TestEmptySidecarDirectoriesAreNoSidecars: a root whose sidecars are all
// gone (their directories left) is a root without sidecars: a Put neither
// looks for one to remove nor needs to.
func TestEmptySidecarDirectoriesAreNoSidecars(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, ".mirrorworker", "meta", "h", "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	var points []string
	ft, err := mirror.OpenWith(root, &mirror.Options{FaultHook: func(p string) { points = append(points, p) }})
	if err != nil {
		t.Fatal(err)
	}
	needXattrs(t, ft)
	if _, err := ft.Put(context.Background(), "h/d/x", strings.NewReader("x"), mirror.Expect{}, mirror.Meta{}); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(points, mirror.FaultOldMetaRemoved) {
		t.Errorf("steps %v: a sidecar was looked for on a root without any", points)
	}
	// One sidecar file anywhere makes every Put remove the key's.
	if err := os.WriteFile(filepath.Join(root, ".mirrorworker", "meta", "h", "d", "y.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	points = nil
	if ft, err = mirror.OpenWith(root, &mirror.Options{FaultHook: func(p string) { points = append(points, p) }}); err != nil {
		t.Fatal(err)
	}
	if _, err := ft.Put(context.Background(), "h/d/x", strings.NewReader("x2"), mirror.Expect{}, mirror.Meta{}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(points, mirror.FaultOldMetaRemoved) {
		t.Errorf("steps %v: on a root with sidecars, the key's was not removed first", points)
	}
}

// TestMetadataTakesABlockAsObjectsDo: what Open found about the
// attribute's block is what a real object shows. A 4 KiB object with its
// metadata has one data block of 4 KiB, and one more where the attribute
// does not fit the inode; the probe's attribute is about as large as the
// object's.
func TestMetadataTakesABlockAsObjectsDo(t *testing.T) {
	ft := xattrTarget(t)
	key := "releases/2026/12/mirrorworker-1.4.2-linux-amd64.tar.gz"
	m := mirror.Meta{
		URL: "https://downloads.example.org/" + key, ETag: `"5f3c1a9e-4b2d1c0"`,
		LastModified: "Thu, 03 Dec 2026 10:15:42 GMT", ContentType: "application/gzip", JobID: "MIRROR_JOBS:123456789",
	}
	if _, err := ft.Put(context.Background(), key, bytes.NewReader(make([]byte, 4096)), mirror.Expect{}, m); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(ft.Root(), filepath.FromSlash(key))
	attr := metaXattr(t, path)
	if n := len(attr); n < 300 || n > 500 {
		t.Fatalf("the object's attribute is %d bytes; the probe assumes 300 to 500", n)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	data := int64(4096 / 512) // st_blocks counts 512-byte units
	blocks := st.Blocks
	if got := blocks > data; got != ft.MetadataTakesABlock() {
		t.Fatalf("the object has %d blocks of 512 bytes (%d of them data): a block for its attribute is %v, Open found %v", blocks, data, got, ft.MetadataTakesABlock())
	}
	t.Logf("%d blocks of 512 bytes for 4096 bytes and a %d-byte attribute; MetadataTakesABlock %v", blocks, len(attr), ft.MetadataTakesABlock())
}
