package mirror

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ownFileSystem decides whether root is a file system of its own
// (ownFileSystemIn), on a kernel whose syncfs(2) reports write-back
// errors (5.8 and later; before, it reported none, where fsync does).
func ownFileSystem(root string) (bool, string) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false, fmt.Sprintf("uname: %v", err)
	}
	if release := unix.ByteSliceToString(u.Release[:]); !kernelAtLeast(release, 5, 8) {
		return false, fmt.Sprintf("Linux %s's syncfs does not report write-back errors (5.8 and later do)", release)
	}
	root, err := cleanRoot(root)
	if err != nil {
		return false, err.Error()
	}
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return false, fmt.Sprintf("stat %s: %v", root, err)
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err.Error()
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)))
	return ownFileSystemIn(parseMountinfo(data), root, dev)
}
