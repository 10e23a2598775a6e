//go:build !linux

package mirror_test

import "testing"

// setMetaXattr is never reached here: without extended attributes
// (xattr_other.go) every object's metadata is a sidecar file, and callers
// check MetadataInXattrs first.
func setMetaXattr(t *testing.T, path string, _ []byte) {
	t.Helper()
	t.Fatalf("%s: no metadata attributes on this system", path)
}
