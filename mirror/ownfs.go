package mirror

import (
	"bufio"
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// A mount is one line of /proc/self/mountinfo (proc(5)): a file system,
// or the part of one under Root, mounted at Point.
type mount struct {
	Dev   string // "major:minor" of the file system
	Root  string // the directory of the file system mounted here: "/" for all of it
	Point string // where it is mounted
	Type  string // ext4, xfs, nfs4, tmpfs, overlay...
}

// parseMountinfo reads the lines of /proc/self/mountinfo. Lines it cannot
// read are left out: a mount missing from the list only makes
// ownFileSystemIn say no.
func parseMountinfo(data []byte) []mount {
	var ms []mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - type source super
		f := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 6 || sep < 0 || sep+1 >= len(f) {
			continue
		}
		ms = append(ms, mount{Dev: f[2], Root: unescapeMount(f[3]), Point: unescapeMount(f[4]), Type: f[sep+1]})
	}
	return ms
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, \011
// tab, \012 newline, \134 backslash).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// localFileSystems are the file system types whose syncfs(2) writes and
// flushes a local device's data and metadata: a shared syncfs can stand
// for per-object fsyncs there. Network and cluster file systems (nfs,
// cephfs, fuse...) are left out: what their syncfs promises is theirs.
var localFileSystems = map[string]bool{
	"ext2": true, "ext3": true, "ext4": true, "xfs": true, "btrfs": true, "f2fs": true, "bcachefs": true,
}

// ownFileSystemIn decides whether root, a cleaned absolute path with no
// symbolic links whose device is dev ("major:minor"), is a file system of
// its own among ms: the whole of a local file system is mounted exactly
// there, and nowhere else. That is a volume given to the target (a
// disk, a partition, a persistent volume's block device), where a syncfs
// flushes only what the target and the programs run for it wrote. why
// says what decided, for the log.
func ownFileSystemIn(ms []mount, root, dev string) (own bool, why string) {
	var at *mount
	var under *mount // the mount that holds root, when root is not a mount point
	for i := range ms {
		m := &ms[i]
		if m.Point == root {
			at = m // a later mount over the same point hides an earlier one
		}
		if under == nil || len(m.Point) >= len(under.Point) {
			if m.Point == "/" || strings.HasPrefix(root, strings.TrimSuffix(m.Point, "/")+"/") {
				under = m
			}
		}
	}
	switch {
	case at == nil:
		if under != nil {
			return false, fmt.Sprintf("%s is a directory of the file system mounted at %s (%s), which it shares", root, under.Point, under.Type)
		}
		return false, fmt.Sprintf("%s is not a mount point", root)
	case at.Root != "/":
		return false, fmt.Sprintf("%s is the directory %s of a file system (%s) mounted there", root, at.Root, at.Type)
	case !localFileSystems[at.Type]:
		return false, fmt.Sprintf("%s is a file system of type %s, not a local disk's", root, at.Type)
	case at.Dev != dev:
		return false, fmt.Sprintf("%s is on device %s, not the %s mounted there", root, dev, at.Dev)
	}
	for i := range ms {
		if m := &ms[i]; m != at && m.Dev == at.Dev {
			return false, fmt.Sprintf("the file system at %s (%s) is mounted at %s too", root, at.Type, m.Point)
		}
	}
	return true, fmt.Sprintf("%s is a file system of its own (%s)", root, at.Type)
}

// kernelAtLeast reports whether the kernel release (uname -r: "6.1.0-18-amd64")
// is major.minor or later.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	digits := strings.IndexFunc(parts[1]+"x", func(r rune) bool { return r < '0' || r > '9' })
	mi, err2 := strconv.Atoi(parts[1][:digits]) // "8-rc1" is 8
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// cleanRoot is root made absolute, without symbolic links, as mountinfo
// names mount points.
func cleanRoot(root string) (string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}
