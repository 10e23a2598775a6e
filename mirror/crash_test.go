package mirror_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
)

// The crash test runs this test binary again as a child process that
// stores one object and kills itself with SIGKILL at a named step of Put
// (mirror.Options.FaultHook). These variables carry the child's part.
const (
	crashRootEnv   = "MW_MIRROR_CRASH_ROOT"
	crashPointEnv  = "MW_MIRROR_CRASH_POINT"
	crashLayoutEnv = "MW_MIRROR_CRASH_LAYOUT"
	crashKeyEnv    = "MW_MIRROR_CRASH_KEY"
)

func TestMain(m *testing.M) {
	if root := os.Getenv(crashRootEnv); root != "" {
		os.Exit(crashChild(root, os.Getenv(crashPointEnv), os.Getenv(crashLayoutEnv), os.Getenv(crashKeyEnv)))
	}
	os.Exit(m.Run())
}

// version returns the bytes and metadata of version v ("v1", "v2") of key;
// the sizes differ so that metadata paired with the other version's bytes
// fails on size as well as on digest.
func version(key, v string) ([]byte, mirror.Meta) {
	n := map[string]int{"v1": 300 << 10, "v2": 200<<10 + 7}[v]
	b := bytes.Repeat([]byte(v+":"+key+";"), n/len(v+":"+key+";")+1)[:n]
	return b, mirror.Meta{URL: "https://h.example/" + key, ETag: `"` + v + `"`, JobID: v}
}

// crashChild stores version v2 of key and dies at point; it returns only
// if Put never reaches point.
func crashChild(root, point, layout, key string) int {
	o := &mirror.Options{Sidecar: layout == "sidecar", FaultHook: func(p string) {
		if p == point {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never continue past the fault point
		}
	}}
	ft, err := mirror.OpenWith(root, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	body, m := version(key, "v2")
	if _, err := ft.Put(context.Background(), key, bytes.NewReader(body), mirror.Expect{}, m); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Fprintf(os.Stderr, "Put returned without reaching %s\n", point)
	return 3
}

// TestCrashDuringPut kills a real process with SIGKILL at every step of
// Put, for a new key and for an overwrite, in each metadata layout, and for
// a root an earlier version wrote (sidecars) that this version overwrites
// with attributes. After each crash the target, reopened, shows either the
// old state or the new one: a whole object of one version or none, and
// metadata that describes exactly those bytes or none (then the next fetch
// is unconditional). What each step must show is spelled out, so a step
// that published too early or too late fails too.
//
// SIGKILL loses nothing the kernel has accepted, so this proves the order
// of the steps and that no step leaves a torn state visible; that the
// fsyncs put each step on the disk before the next one is the argument of
// docs/adr/0013-object-metadata-in-extended-attributes.md, not of this test.
func TestCrashDuringPut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	xattrs := open(t).MetadataInXattrs()
	type step struct {
		point string
		obj   string // the version of the object after the crash ("": none)
		meta  string // the version Stat vouches for ("": ErrNotFound)
	}
	// For an overwrite of v1 by v2; for a new key "v1" reads "".
	scenarios := []struct {
		layout   string // of the crashing Put: "xattr" or "sidecar"
		v1Layout string // of the Put that stored v1 before
		steps    []step
	}{
		{layout: "xattr", v1Layout: "xattr", steps: []step{
			{mirror.FaultObjectWritten, "v1", "v1"},
			{mirror.FaultObjectSynced, "v1", "v1"},
			{mirror.FaultObjectRenamed, "v2", "v2"},
			{mirror.FaultObjectDirSynced, "v2", "v2"},
			{mirror.FaultCommitted, "v2", "v2"},
		}},
		{layout: "sidecar", v1Layout: "sidecar", steps: []step{
			{mirror.FaultObjectWritten, "v1", "v1"},
			{mirror.FaultObjectSynced, "v1", "v1"},
			{mirror.FaultSidecarWritten, "v1", "v1"},
			{mirror.FaultOldMetaRemoved, "v1", ""},
			{mirror.FaultObjectRenamed, "v2", ""},
			{mirror.FaultObjectDirSynced, "v2", ""},
			{mirror.FaultSidecarRenamed, "v2", "v2"},
			{mirror.FaultCommitted, "v2", "v2"},
		}},
		// An upgrade: v1 has a sidecar, v2 an attribute.
		{layout: "xattr", v1Layout: "sidecar", steps: []step{
			{mirror.FaultObjectWritten, "v1", "v1"},
			{mirror.FaultObjectSynced, "v1", "v1"},
			{mirror.FaultOldMetaRemoved, "v1", ""},
			{mirror.FaultObjectRenamed, "v2", "v2"},
			{mirror.FaultObjectDirSynced, "v2", "v2"},
			{mirror.FaultCommitted, "v2", "v2"},
		}},
	}
	for _, sc := range scenarios {
		if sc.layout == "xattr" && !xattrs {
			t.Errorf("%s has no user extended attributes: the attribute layout is not covered here", os.TempDir())
			continue
		}
		for _, overwrite := range []bool{true, false} {
			if !overwrite && sc.v1Layout != sc.layout {
				continue // nothing stored before: same as the plain layout
			}
			for _, st := range sc.steps {
				name := fmt.Sprintf("%s-over-%s/overwrite=%v/%s", sc.layout, sc.v1Layout, overwrite, st.point)
				t.Run(name, func(t *testing.T) {
					root := t.TempDir()
					const key = "h.example/dir/obj"
					if overwrite {
						prev, err := mirror.OpenWith(root, &mirror.Options{Sidecar: sc.v1Layout == "sidecar"})
						if err != nil {
							t.Fatal(err)
						}
						body, m := version(key, "v1")
						if _, err := prev.Put(context.Background(), key, bytes.NewReader(body), mirror.Expect{}, m); err != nil {
							t.Fatal(err)
						}
					}
					runCrashChild(t, root, st.point, sc.layout, key)
					want := st
					if !overwrite {
						if want.obj == "v1" {
							want.obj = ""
						}
						if want.meta == "v1" {
							want.meta = ""
						}
					}
					checkAfterCrash(t, root, key, want.obj, want.meta)
				})
			}
		}
	}
}

// runCrashChild runs the child and waits for it to die of SIGKILL.
func runCrashChild(t *testing.T, root, point, layout, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashRootEnv+"="+root, crashPointEnv+"="+point, crashLayoutEnv+"="+layout, crashKeyEnv+"="+key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v, want killed at %s; stderr: %s", err, point, stderr.String())
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL || ctx.Err() != nil {
		t.Fatalf("child exited with %v, want SIGKILL at %s; stderr: %s", err, point, stderr.String())
	}
}

// checkAfterCrash reopens root and checks that it shows version obj of
// key's object ("": none), Stat vouching for version meta ("": ErrNotFound),
// and nothing else: no other visible file, no temporary file after Open,
// and no sidecar that describes other bytes than the object's (a reader of
// an earlier version trusts sidecars alone).
func checkAfterCrash(t *testing.T, root, key, obj, meta string) {
	t.Helper()
	ft, err := mirror.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	visible, temps := files(t, root)
	wantVisible := []string{}
	if obj != "" {
		wantVisible = []string{key}
	}
	if !slices.Equal(visible, wantVisible) || len(temps) != 0 {
		t.Errorf("visible %v (want %v), temporary %v", visible, wantVisible, temps)
	}
	got, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(key)))
	switch {
	case obj == "" && !errors.Is(err, os.ErrNotExist):
		t.Errorf("object: %d bytes, %v; want none", len(got), err)
	case obj != "":
		want, _ := version(key, obj)
		if !bytes.Equal(got, want) {
			t.Errorf("object is %d bytes (%v), not version %s's %d", len(got), err, obj, len(want))
		}
	}
	m, err := ft.Stat(context.Background(), key)
	switch {
	case meta == "" && !errors.Is(err, mirror.ErrNotFound):
		t.Errorf("Stat = %+v, %v; want ErrNotFound", m, err)
	case meta != "" && err != nil:
		t.Errorf("Stat: %v; want version %s's metadata", err, meta)
	case meta != "":
		want, _ := version(key, meta)
		sum := sha256.Sum256(got)
		if m.JobID != meta || m.SHA256 != hex.EncodeToString(sum[:]) || m.Size != int64(len(want)) {
			t.Errorf("Stat = %+v; want version %s's metadata for the bytes on disk", m, meta)
		}
	}
	if data, err := os.ReadFile(filepath.Join(root, ".mirrorworker", "meta", filepath.FromSlash(key)+".json")); err == nil {
		var sc mirror.Meta
		sum := sha256.Sum256(got)
		if json.Unmarshal(data, &sc) != nil || sc.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("a sidecar describes other bytes than the object's: %+v", sc)
		}
	}
}
