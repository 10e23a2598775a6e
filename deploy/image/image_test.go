package image_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/mirrorworker/mirrorworker/deploy/image"
)

// TestImage builds the static binary from the main module, builds the image
// the way `make image` does, reads it back from its OCI layout, checks its
// config, extracts the binary from the layer and runs `version`.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the mirrorworker binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "mirrorworker")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version=v0.0.0-imagetest", "-o", bin, "./cmd/mirrorworker")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := image.Build(image.Options{Binary: bin, Version: "v0.0.0-imagetest", CABundle: ca})
	if err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(dir, "oci")
	if err := image.WriteLayout(oci, img, "mirrorworker:test"); err != nil {
		t.Fatal(err)
	}
	if err := image.WriteTarball(filepath.Join(dir, "image.tar"), img, "mirrorworker:test"); err != nil {
		t.Fatal(err)
	}

	idx, err := layout.ImageIndexFromPath(oci)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %v, %d manifests", err, len(im.Manifests))
	}
	got, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if len(c.Entrypoint) != 1 || c.Entrypoint[0] != image.BinaryPath {
		t.Errorf("entrypoint %v", c.Entrypoint)
	}
	if c.User == "" || strings.HasPrefix(c.User, "0") || strings.HasPrefix(c.User, "root") {
		t.Errorf("user %q, want a non-root numeric user", c.User)
	}
	if _, ok := c.ExposedPorts[image.AdminPort]; !ok {
		t.Errorf("exposed ports %v lack the admin port %s", c.ExposedPorts, image.AdminPort)
	}
	for k, want := range map[string]string{"org.opencontainers.image.version": "v0.0.0-imagetest", "org.opencontainers.image.title": "mirrorworker"} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}

	layers, err := got.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %v, %d", err, len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	extracted := filepath.Join(dir, "extracted")
	seen := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen["/"+strings.TrimSuffix(h.Name, "/")] = h
		if "/"+h.Name == image.BinaryPath {
			f, err := os.OpenFile(extracted, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	if h := seen[image.DataDir]; h == nil || h.Uid != 65532 {
		t.Errorf("data dir %s not in the layer or not owned by the runtime user: %+v", image.DataDir, h)
	}
	if seen[image.CAPath] == nil {
		t.Errorf("no root CAs at %s", image.CAPath)
	}
	out, err := exec.Command(extracted, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("extracted binary: %v\n%s", err, out)
	}
	if want := "mirrorworker v0.0.0-imagetest"; strings.TrimSpace(string(out)) != want {
		t.Errorf("version = %q, want %q", out, want)
	}
}
