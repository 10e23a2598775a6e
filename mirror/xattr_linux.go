//go:build linux

package mirror

import (
	"errors"

	"golang.org/x/sys/unix"
)

// xattrName is the extended attribute that holds an object's metadata
// (JSON, as in the sidecar). "user." is the namespace an unprivileged
// process may write on ext4, XFS, btrfs, tmpfs (Linux 6.6+) and others.
const xattrName = "user.mirrorworker.meta"

// setMetaXattr attaches data to the open file fd.
func setMetaXattr(fd int, data []byte) error {
	return unix.Fsetxattr(fd, xattrName, data, 0)
}

// getMetaXattr reads the metadata attribute of the open file fd.
// errNoXattr: the file has none (an object a sidecar describes).
func getMetaXattr(fd int) ([]byte, error) {
	buf := make([]byte, 2048)
	for {
		n, err := unix.Fgetxattr(fd, xattrName, buf)
		switch {
		case err == nil:
			return buf[:n], nil
		case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP):
			return nil, errNoXattr
		case errors.Is(err, unix.ERANGE) && len(buf) < 1<<20:
			// Grown since sized, or longer than the first guess.
			size, err := unix.Fgetxattr(fd, xattrName, nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, max(size, 2*len(buf)))
		default:
			return nil, err
		}
	}
}

// xattrUnsupported reports an error that says the file system (or this
// file) cannot hold the attribute: no user xattrs at all (ENOTSUP), or not
// one this large (E2BIG, ERANGE; ext4 says ENOSPC for a value that does not
// fit its inode and one block). The metadata then goes to a sidecar; if the
// disk is really full, writing the sidecar fails with the real error.
func xattrUnsupported(err error) bool {
	return errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.E2BIG) ||
		errors.Is(err, unix.ERANGE) || errors.Is(err, unix.ENOSPC)
}

// startWriteback asks the kernel to start writing the given range of fd to
// disk now, without waiting, so that a large object's final fsync finds
// little left to write and the disk works while the network does. It is
// an optimisation only: durability still comes from the fsync.
func startWriteback(fd int, off, n int64) {
	_ = unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WRITE)
}
