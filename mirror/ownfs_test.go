package mirror

import (
	"strings"
	"testing"
)

// A mount table as /proc/self/mountinfo gives it: a VM's root, a disk
// given to the mirror, a bind mount of a directory (a container's
// emptyDir or Docker volume), an NFS share, a disk mounted twice, a path
// with a space.
const mountinfoFixture = `21 26 0:20 / /proc rw,relatime - proc proc rw
26 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
24 23 0:22 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683748k
40 26 259:1 / /srv/mirror rw,noatime shared:12 - xfs /dev/nvme0n1p1 rw,attr2
41 26 254:0 /var/lib/kubelet/pods/x/volumes/kubernetes.io~empty-dir/mirror /data/mirror rw,relatime - ext4 /dev/vda rw
42 26 0:51 / /mnt/nfs rw,relatime - nfs4 10.0.0.2:/export rw,vers=4.2
43 26 8:17 / /mnt/twice rw,relatime - ext4 /dev/sdb1 rw
44 26 8:17 / /mnt/again rw,relatime - ext4 /dev/sdb1 rw
45 26 8:33 / /mnt/with\040space rw,relatime master:3 - btrfs /dev/sdc1 rw
bad line
`

func TestOwnFileSystemIn(t *testing.T) {
	ms := parseMountinfo([]byte(mountinfoFixture))
	if len(ms) != 9 {
		t.Fatalf("parsed %d mounts, want 9: %+v", len(ms), ms)
	}
	for _, c := range []struct {
		root, dev string
		own       bool
		why       string
	}{
		{"/srv/mirror", "259:1", true, "/srv/mirror is a file system of its own (xfs)"},
		{"/srv/mirror/objects", "259:1", false, "directory of the file system mounted at /srv/mirror (xfs), which it shares"},
		{"/tmp/x", "254:0", false, "directory of the file system mounted at / (ext4), which it shares"},
		{"/", "254:0", false, "mounted at /data/mirror too"},
		{"/data/mirror", "254:0", false, "the directory /var/lib/kubelet/pods/x/volumes/kubernetes.io~empty-dir/mirror of a file system (ext4)"},
		{"/dev/shm", "0:22", false, "file system of type tmpfs"},
		{"/mnt/nfs", "0:51", false, "file system of type nfs4"},
		{"/mnt/twice", "8:17", false, "mounted at /mnt/again too"},
		{"/mnt/with space", "8:33", true, "of its own (btrfs)"},
		{"/srv/mirror", "0:99", false, "on device 0:99"}, // a btrfs subvolume, say
	} {
		own, why := ownFileSystemIn(ms, c.root, c.dev)
		if own != c.own || !strings.Contains(why, c.why) {
			t.Errorf("%s: got %v (%s), want %v (%s)", c.root, own, why, c.own, c.why)
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	for _, c := range []struct {
		release string
		want    bool
	}{
		{"5.8.0", true}, {"5.7.19", false}, {"6.1.0-18-amd64", true}, {"4.19.0", false},
		{"5.10.0+", true}, {"5.8-rc1", true}, {"10.0", true}, {"5", false}, {"x.y", false},
	} {
		if got := kernelAtLeast(c.release, 5, 8); got != c.want {
			t.Errorf("kernelAtLeast(%q, 5, 8) = %v, want %v", c.release, got, c.want)
		}
	}
}

// TestSyncAutoOnASharedFileSystem: a directory of whatever file system
// holds the test's temporary directory is never one of its own, so
// SyncAuto fsyncs each object there, and says why.
func TestSyncAutoOnASharedFileSystem(t *testing.T) {
	dir := t.TempDir()
	tg, err := OpenWith(dir, &Options{SyncAuto: true})
	if err != nil {
		t.Fatal(err)
	}
	whole, why := tg.SyncMode()
	if whole || why == "" {
		t.Fatalf("SyncMode() = %v, %q: want per-object fsyncs and the reason", whole, why)
	}
	t.Logf("found: %s", why)
}
