// Package testbin builds the programs that tests run as processes of their
// own (nats-server for a real cluster, versitygw for a real S3 server), and
// finds free loopback ports for them.
//
// A program is built once into os.UserCacheDir()/mirrorworker-test/
// <name>-<version>/<name>, where every test binary of every package, and
// every later run, finds it. Test binaries of several packages run at once
// (go test ./...): one builds, under a lock file, into a temporary name in
// that directory and renames it into place; the others wait on the lock and
// then find it, so none ever runs a partial binary, and a build that crashed
// leaves nothing a later run would trust.
//
// It is for tests only.
package testbin

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Program is a main package to build.
type Program struct {
	// Name is the binary's name.
	Name string
	// Package is the main package's import path, and Module its module.
	Package, Module string
	// Version pins the module: the binary is go install Package@Version,
	// built outside any module and workspace. Empty means the version the
	// test's own module requires (go build inside it, with its go.sum),
	// looked up with go list -m.
	Version string
}

var (
	mu    sync.Mutex
	built = map[Program]*result{}
)

type result struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of p's binary, building it if no earlier test or
// run did. A failed build fails the test (with the go command's output),
// and every later call of the process returns the same failure.
func Binary(t testing.TB, p Program) string {
	t.Helper()
	mu.Lock()
	r := built[p]
	if r == nil {
		r = &result{}
		built[p] = r
	}
	mu.Unlock()
	r.once.Do(func() { r.path, r.err = build(p) })
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.path
}

func build(p Program) (string, error) {
	version := p.Version
	if version == "" {
		out, err := exec.Command("go", "list", "-m", "-f", "{{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}", p.Module).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("testbin: go list -m %s: %v\n%s", p.Module, err, out)
		}
		version = strings.TrimSpace(string(out))
	}
	if version == "" {
		// A replacement by a directory has no version to name a cache
		// entry by: build afresh for this process.
		dir, err := os.MkdirTemp("", "mirrorworker-test-"+p.Name+"-")
		if err != nil {
			return "", fmt.Errorf("testbin: %w", err)
		}
		return filepath.Join(dir, p.Name), goBuild(p, dir)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("testbin: cache dir: %w", err)
	}
	dir := filepath.Join(cache, "mirrorworker-test", p.Name+"-"+version)
	bin := filepath.Join(dir, p.Name)
	if isFile(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("testbin: lock %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if isFile(bin) { // built by another test binary while this one waited
		return bin, nil
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := goBuild(p, tmp); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(tmp, p.Name), bin); err != nil {
		return "", fmt.Errorf("testbin: %w", err)
	}
	return bin, nil
}

// goBuild writes p's binary into dir.
func goBuild(p Program, dir string) error {
	var cmd *exec.Cmd
	if p.Version == "" {
		cmd = exec.Command("go", "build", "-o", filepath.Join(dir, p.Name), p.Package)
	} else {
		cmd = exec.Command("go", "install", p.Package+"@"+p.Version)
		// Outside any module and workspace, so that the pinned version is
		// what is built.
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off", "GOFLAGS=-buildvcs=false")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testbin: %s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return nil
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// FreePorts returns n distinct free loopback ports. They are released
// before use, so another process could take one in between; on a test
// machine that is rare, and the server that loses the race fails to start
// loudly.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// Held until all n are taken, so that the n are distinct.
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
