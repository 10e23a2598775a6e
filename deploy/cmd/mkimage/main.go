// Command mkimage builds the mirrorworker OCI image from a static binary
// without Docker and without a registry: one layer (the binary, root CAs,
// the data directory) appended to an empty base, the same image the
// Dockerfile describes. `make image` runs it.
//
//	go run ./cmd/mkimage --binary ../bin/mirrorworker-linux --version v1.2.3 --oci ../bin/image --tar ../bin/mirrorworker-image.tar
//
// --oci writes an OCI image layout (skopeo copy oci:bin/image docker://...,
// podman load); --tar a tarball `docker load` takes.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/mirrorworker/mirrorworker/deploy/image"
)

func main() {
	var o image.Options
	var ociDir, tarPath, tag string
	flag.StringVar(&o.Binary, "binary", "", "the static linux mirrorworker binary (CGO_ENABLED=0)")
	flag.StringVar(&o.Version, "version", "dev", "version label of the image")
	flag.StringVar(&o.Arch, "arch", "amd64", "architecture of the binary")
	flag.StringVar(&o.CABundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "PEM root CAs to ship for HTTPS origins (empty: none)")
	flag.StringVar(&ociDir, "oci", "", "write an OCI image layout to this directory")
	flag.StringVar(&tarPath, "tar", "", "write a docker-loadable tarball to this file")
	flag.StringVar(&tag, "tag", "mirrorworker:dev", "image reference recorded in the tarball")
	flag.Parse()
	if o.Binary == "" || (ociDir == "" && tarPath == "") {
		fmt.Fprintln(os.Stderr, "mkimage: --binary and one of --oci or --tar are required")
		flag.Usage()
		os.Exit(2)
	}
	img, err := image.Build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	if ociDir != "" {
		if err := image.WriteLayout(ociDir, img, tag); err != nil {
			fmt.Fprintln(os.Stderr, "mkimage:", err)
			os.Exit(1)
		}
		fmt.Println("OCI image layout:", ociDir)
	}
	if tarPath != "" {
		if err := image.WriteTarball(tarPath, img, tag); err != nil {
			fmt.Fprintln(os.Stderr, "mkimage:", err)
			os.Exit(1)
		}
		fmt.Println("docker load -i", tarPath)
	}
}
