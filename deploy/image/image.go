// Package image builds the mirrorworker container image with
// go-containerregistry: an empty base (FROM scratch) plus one layer, so no
// registry is needed. Its config is the Dockerfile's.
package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where things are in the image, and who runs it.
const (
	BinaryPath = "/usr/local/bin/mirrorworker"
	CAPath     = "/etc/ssl/certs/ca-certificates.crt"
	DataDir    = "/var/lib/mirrorworker"
	User       = "65532:65532" // numeric, so runAsNonRoot can check it
	uid        = 65532
	AdminPort  = "8081/tcp"
)

// Options are the inputs of Build.
type Options struct {
	Binary   string // static linux binary; required
	Version  string // the version label
	Arch     string // default amd64
	CABundle string // PEM root CAs; empty: none
}

// Build returns the image.
func Build(o Options) (v1.Image, error) {
	if o.Arch == "" {
		o.Arch = "amd64"
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("binary: %w", err)
	}
	if len(bin) < 4 || !bytes.Equal(bin[:4], []byte("\x7fELF")) {
		return nil, fmt.Errorf("binary %s is not a linux (ELF) executable: build it with GOOS=linux CGO_ENABLED=0", o.Binary)
	}
	var ca []byte
	if o.CABundle != "" {
		if ca, err = os.ReadFile(o.CABundle); err != nil {
			return nil, fmt.Errorf("ca bundle: %w (pass --ca-bundle, or empty for none)", err)
		}
	}
	layerTar, err := layerBytes(bin, ca)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			CreatedBy: "mirrorworker deploy/cmd/mkimage: " + BinaryPath + ", root CAs, " + DataDir,
			Created:   v1.Time{Time: time.Unix(0, 0).UTC()},
		},
		MediaType: types.OCILayer,
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = o.Arch, "linux"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()} // reproducible
	cf.Config = v1.Config{
		Entrypoint:   []string{BinaryPath},
		Cmd:          []string{"run"},
		User:         User,
		WorkingDir:   DataDir,
		Env:          []string{"MIRRORWORKER_DATA_DIR=" + DataDir},
		ExposedPorts: map[string]struct{}{AdminPort: {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "mirrorworker",
			"org.opencontainers.image.description": "Polite URL mirroring worker on NATS JetStream",
			"org.opencontainers.image.version":     o.Version,
			"org.opencontainers.image.source":      "https://github.com/mirrorworker/mirrorworker",
		},
	}
	return mutate.ConfigFile(img, cf)
}

// layerBytes is the one layer: directories, the binary, the CAs and the
// data directory owned by the runtime user. Times are fixed so that one
// binary always gives one image digest.
func layerBytes(bin, ca []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0).UTC()
	dir := func(p string, owner int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p, Mode: 0o755, ModTime: epoch, Uid: owner, Gid: owner, Format: tar.FormatPAX})
	}
	file := func(p string, mode int64, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	var err error
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/", "etc/", "etc/ssl/", "etc/ssl/certs/", "var/", "var/lib/", "tmp/"} {
		err = errors.Join(err, dir(d, 0))
	}
	err = errors.Join(err, dir("var/lib/mirrorworker/", uid))
	err = errors.Join(err, file(BinaryPath[1:], 0o755, bin))
	if ca != nil {
		err = errors.Join(err, file(CAPath[1:], 0o644, ca))
	}
	err = errors.Join(err, tw.Close())
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img as an OCI image layout in dir, replacing it.
func WriteLayout(dir string, img v1.Image, tag string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci layout: %w", err)
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
}

// WriteTarball writes img as a tarball `docker load` takes.
func WriteTarball(path string, img v1.Image, tag string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("tag %q: %w", tag, err)
	}
	return tarball.WriteToFile(path, ref, img)
}
