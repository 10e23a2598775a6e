package mirror_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/mirrorworker/mirrorworker/mirror"
)

func TestFailureCode(t *testing.T) {
	pathErr := func(e error) error {
		return fmt.Errorf("put %q: write: %w", "a/b", &os.PathError{Op: "write", Path: "/m/.mirrorworker/tmp/obj-1", Err: e})
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"disk full", pathErr(syscall.ENOSPC), "ENOSPC"},
		{"quota", pathErr(syscall.EDQUOT), "EDQUOT"},
		{"read-only", pathErr(syscall.EROFS), "EROFS"},
		{"i/o error", pathErr(syscall.EIO), "EIO"},
		{"object store down", fmt.Errorf("put: dial: %w", mirror.ErrUnavailable), "unavailable"},
		{"permission is the operator's, not a full disk", pathErr(syscall.EACCES), ""},
		{"a job's bytes", fmt.Errorf("put: %w", mirror.ErrSizeMismatch), ""},
		{"a key conflict", mirror.ErrKeyConflict, ""},
		{"nil", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := mirror.FailureCode(tc.err); got != tc.want {
				t.Errorf("FailureCode(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

func TestProbeLeavesNothing(t *testing.T) {
	root := t.TempDir()
	ft, err := mirror.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := ft.Probe(context.Background()); err != nil {
		t.Fatalf("Probe on a writable root: %v", err)
	}
	left, err := os.ReadDir(filepath.Join(root, mirror.ReservedDir, "tmp"))
	if err != nil || len(left) != 0 {
		t.Errorf("after Probe: %d temporary files, %v", len(left), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ft.Probe(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Probe with a cancelled context: %v", err)
	}
}
