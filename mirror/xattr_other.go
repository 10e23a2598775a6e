//go:build !linux

package mirror

import "syscall"

const xattrName = "user.mirrorworker.meta"

// Extended attributes are used on Linux only; elsewhere every object's
// metadata is a sidecar file.
func setMetaXattr(int, []byte) error   { return syscall.ENOTSUP }
func getMetaXattr(int) ([]byte, error) { return nil, errNoXattr }
func xattrUnsupported(err error) bool  { return err == syscall.ENOTSUP }

func startWriteback(int, int64, int64) {}
