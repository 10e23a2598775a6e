// Command mkimage builds the mirrorworker OCI image from a static binary
// without Docker and without a registry: one layer (the binary, root CAs,
// the data directory) appended to an empty base, the same image the
// Dockerfile describes. `make image` runs it.
//
//	go run ./cmd/mkimage --binary ../bin/mirrorworker-linux --version v1.2.3 --oci ../bin/image --tar ../bin/mirrorworker-image.tar
//
// --oci writes an OCI image layout (skopeo copy oci:bin/image docker://...,
// podman load); --tar a tarball `docker load` takes. The commands it
// prints name absolute paths, so that they work from any directory (make
// runs it in deploy/, people paste them at the repository's root).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/mirrorworker/mirrorworker/deploy/image"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var o image.Options
	var ociDir, tarPath, tag string
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Binary, "binary", "", "the static linux mirrorworker binary (CGO_ENABLED=0)")
	fs.StringVar(&o.Version, "version", "dev", "version label of the image")
	fs.StringVar(&o.Arch, "arch", "amd64", "architecture of the binary")
	fs.StringVar(&o.CABundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "PEM root CAs to ship for HTTPS origins (empty: none)")
	fs.StringVar(&ociDir, "oci", "", "write an OCI image layout to this directory")
	fs.StringVar(&tarPath, "tar", "", "write a docker-loadable tarball to this file")
	fs.StringVar(&tag, "tag", "mirrorworker:dev", "image reference recorded in the tarball")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.Binary == "" || (ociDir == "" && tarPath == "") {
		fmt.Fprintln(stderr, "mkimage: --binary and one of --oci or --tar are required")
		fs.Usage()
		return 2
	}
	img, err := image.Build(o)
	if err != nil {
		fmt.Fprintln(stderr, "mkimage:", err)
		return 1
	}
	if ociDir != "" {
		if err := image.WriteLayout(ociDir, img, tag); err != nil {
			fmt.Fprintln(stderr, "mkimage:", err)
			return 1
		}
		fmt.Fprintln(stdout, "OCI image layout:", abs(ociDir), "(skopeo copy oci:"+abs(ociDir)+" docker://REGISTRY/"+tag+")")
	}
	if tarPath != "" {
		if err := image.WriteTarball(tarPath, img, tag); err != nil {
			fmt.Fprintln(stderr, "mkimage:", err)
			return 1
		}
		fmt.Fprintln(stdout, "docker load -i", abs(tarPath))
	}
	// The kustomize base names the image mirrorworker:dev; point it at
	// this tag (after pushing it where the cluster pulls from).
	name, version, _ := strings.Cut(tag, ":")
	fmt.Fprintf(stdout, "image %s; to deploy it: (cd deploy/kubernetes/base && kustomize edit set image %s=%s:%s)\n", tag, name, name, version)
	return 0
}

func abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
