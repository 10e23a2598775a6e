package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrintedCommandsWorkFromAnywhere: the paths mkimage prints are
// absolute, so `docker load -i ...` works from the repository's root as
// well as from deploy/, where make runs it; it says how to point the
// kustomize base at the tag.
func TestPrintedCommandsWorkFromAnywhere(t *testing.T) {
	dir := t.TempDir()
	// Build only checks that the binary is ELF; the image test builds the
	// real one.
	bin := filepath.Join(dir, "mirrorworker")
	if err := os.WriteFile(bin, []byte("\x7fELF not really a binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	var stdout, stderr bytes.Buffer
	code := run([]string{"--binary", bin, "--ca-bundle", "", "--tar", "out/mirrorworker-image.tar", "--tag", "mirrorworker:v1.2.3"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := "docker load -i " + filepath.Join(dir, "out", "mirrorworker-image.tar") + "\n"
	if !strings.Contains(stdout.String(), want) {
		t.Errorf("stdout %q does not say %q", stdout.String(), want)
	}
	if _, err := os.Stat(filepath.Join(dir, "out", "mirrorworker-image.tar")); err != nil {
		t.Error(err)
	}
	if !strings.Contains(stdout.String(), "kustomize edit set image mirrorworker=mirrorworker:v1.2.3") {
		t.Errorf("stdout %q does not say how to set the kustomize image", stdout.String())
	}
}
