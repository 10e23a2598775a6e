package mirror_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
)

func open(t testing.TB) *mirror.FileTarget {
	t.Helper()
	return openWith(t, nil)
}

func openWith(t testing.TB, o *mirror.Options) *mirror.FileTarget {
	t.Helper()
	ft, err := mirror.OpenWith(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	if o == nil && !ft.MetadataInXattrs() {
		t.Logf("this file system has no user extended attributes: the tests cover the sidecar layout only")
	}
	return ft
}

// layouts are the two places metadata may live; the tests of Put and Stat
// run against both.
var layouts = []struct {
	name string
	opt  *mirror.Options
}{
	{"xattr", nil},
	{"sidecar", &mirror.Options{Sidecar: true}},
}

// forLayouts runs f once per metadata layout.
func forLayouts(t *testing.T, f func(t *testing.T, o *mirror.Options)) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) { f(t, l.opt) })
	}
}

// corruptMeta replaces key's stored metadata with bytes that are not JSON,
// wherever the target keeps it.
func corruptMeta(t *testing.T, ft *mirror.FileTarget, key string) {
	t.Helper()
	if ft.MetadataInXattrs() {
		setMetaXattr(t, filepath.Join(ft.Root(), filepath.FromSlash(key)), []byte("{"))
		return
	}
	if err := os.WriteFile(filepath.Join(ft.Root(), ".mirrorworker", "meta", filepath.FromSlash(key)+".json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// files lists the files under root, relative and '/'-separated, split into
// those outside the reserved directory and the temporary ones.
func files(t *testing.T, root string) (visible, temps []string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		switch {
		case strings.HasPrefix(rel, ".mirrorworker/tmp/"):
			temps = append(temps, rel)
		case !strings.HasPrefix(rel, ".mirrorworker/"):
			visible = append(visible, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(visible)
	return visible, temps
}

func TestPutStatRoundTrip(t *testing.T) { forLayouts(t, testPutStatRoundTrip) }

func testPutStatRoundTrip(t *testing.T, o *mirror.Options) {
	ft := openWith(t, o)
	ctx := context.Background()
	body := []byte("hello, mirror\n")
	in := mirror.Meta{
		URL:          "https://user:secret@files.example.org/a/b.txt",
		ETag:         `"abc"`,
		LastModified: "Wed, 21 Oct 2015 07:28:00 GMT",
		ContentType:  "text/plain",
		FetchedAt:    time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC),
		JobID:        "job-1",
		SHA256:       "ignored: computed from the bytes",
		Size:         999,
	}
	got, err := ft.Put(ctx, "files.example.org/a/b.txt", bytes.NewReader(body),
		mirror.Expect{SHA256: strings.ToUpper(hexSum(body)), Size: int64(len(body)), HasSize: true}, in)
	if err != nil {
		t.Fatal(err)
	}
	want := in
	want.Key, want.SHA256, want.Size = "files.example.org/a/b.txt", hexSum(body), int64(len(body))
	want.URL = "https://files.example.org/a/b.txt"
	if got != want {
		t.Errorf("Put returned\n%+v\nwant\n%+v", got, want)
	}
	st, err := ft.Stat(ctx, "files.example.org/a/b.txt")
	if err != nil {
		t.Fatal(err)
	}
	if !st.FetchedAt.Equal(want.FetchedAt) {
		t.Errorf("FetchedAt %v", st.FetchedAt)
	}
	st.FetchedAt = want.FetchedAt
	if st != want {
		t.Errorf("Stat returned\n%+v\nwant\n%+v", st, want)
	}
	onDisk, err := os.ReadFile(filepath.Join(ft.Root(), "files.example.org", "a", "b.txt"))
	if err != nil || !bytes.Equal(onDisk, body) {
		t.Errorf("object on disk %q, %v", onDisk, err)
	}
	_, err = os.Stat(filepath.Join(ft.Root(), ".mirrorworker", "meta", "files.example.org", "a", "b.txt.json"))
	if sidecar := !ft.MetadataInXattrs(); sidecar != (err == nil) {
		t.Errorf("sidecar file: %v (want one: %v)", err, sidecar)
	}
	visible, temps := files(t, ft.Root())
	if fmt.Sprint(visible) != "[files.example.org/a/b.txt]" || len(temps) != 0 {
		t.Errorf("visible %v temps %v", visible, temps)
	}

	// Overwrite: the new bytes and metadata replace the old.
	body2 := []byte("v2")
	if _, err := ft.Put(ctx, "files.example.org/a/b.txt", bytes.NewReader(body2), mirror.Expect{}, mirror.Meta{ETag: `"v2"`}); err != nil {
		t.Fatal(err)
	}
	st, err = ft.Stat(ctx, "files.example.org/a/b.txt")
	if err != nil || st.ETag != `"v2"` || st.SHA256 != hexSum(body2) || st.Size != 2 {
		t.Errorf("after overwrite: %+v, %v", st, err)
	}
}

func TestStatNotFound(t *testing.T) { forLayouts(t, testStatNotFound) }

func testStatNotFound(t *testing.T, o *mirror.Options) {
	ft := openWith(t, o)
	ctx := context.Background()
	put := func(key, body string) {
		t.Helper()
		if _, err := ft.Put(ctx, key, strings.NewReader(body), mirror.Expect{}, mirror.Meta{ETag: `"e"`}); err != nil {
			t.Fatal(err)
		}
	}
	put("gone", "x")
	put("resized", "abc")
	put("corrupt", "abc")
	put("dir/obj", "abc")
	if err := os.Remove(filepath.Join(ft.Root(), "gone")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ft.Root(), "resized"), []byte("abcd"), 0o644); err != nil {
		t.Fatal(err)
	}
	corruptMeta(t, ft, "corrupt")
	if err := os.Symlink("dir/obj", filepath.Join(ft.Root(), "link")); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"absent", "gone", "resized", "corrupt", "dir", "dir/obj/deeper", "absent/x", "link"} {
		if _, err := ft.Stat(ctx, key); !errors.Is(err, mirror.ErrNotFound) {
			t.Errorf("Stat(%q) = %v, want ErrNotFound", key, err)
		}
	}
	if _, err := ft.Stat(ctx, "dir/obj"); err != nil {
		t.Errorf("Stat(dir/obj): %v", err)
	}
	if _, err := ft.Stat(ctx, "../etc/passwd"); !errors.Is(err, mirror.ErrInvalidKey) {
		t.Errorf("Stat of a bad key: %v", err)
	}
}

// failingReader yields n bytes, then an error.
type failingReader struct {
	n   int
	err error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, r.err
	}
	k := min(len(p), r.n)
	for i := range p[:k] {
		p[i] = 'f'
	}
	r.n -= k
	return k, nil
}

func TestNothingStoredOnFailure(t *testing.T) { forLayouts(t, testNothingStoredOnFailure) }

func testNothingStoredOnFailure(t *testing.T, o *mirror.Options) {
	body := []byte("the expected bytes")
	errBoom := errors.New("connection reset mid-body")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		body    io.Reader
		want    mirror.Expect
		wantErr error
	}{
		{name: "reader fails mid-stream", body: &failingReader{n: 300 << 10, err: errBoom}, wantErr: errBoom},
		{name: "digest mismatch", body: bytes.NewReader(body), want: mirror.Expect{SHA256: hexSum([]byte("other"))}, wantErr: mirror.ErrDigestMismatch},
		{name: "size mismatch", body: bytes.NewReader(body), want: mirror.Expect{Size: 3, HasSize: true}, wantErr: mirror.ErrSizeMismatch},
		{name: "empty body, size expected", body: bytes.NewReader(nil), want: mirror.Expect{Size: 1, HasSize: true}, wantErr: mirror.ErrSizeMismatch},
		{name: "cancelled", ctx: cancelled, body: bytes.NewReader(body), wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ft := openWith(t, o)
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			_, err := ft.Put(ctx, "host/dir/obj", tt.body, tt.want, mirror.Meta{})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Put: %v, want %v", err, tt.wantErr)
			}
			visible, temps := files(t, ft.Root())
			if len(visible) != 0 || len(temps) != 0 {
				t.Errorf("left behind: visible %v temps %v", visible, temps)
			}
			if _, err := ft.Stat(context.Background(), "host/dir/obj"); !errors.Is(err, mirror.ErrNotFound) {
				t.Errorf("Stat: %v", err)
			}
		})
	}
	// A failed overwrite leaves the previous object and metadata intact.
	ft := openWith(t, o)
	ctx := context.Background()
	if _, err := ft.Put(ctx, "k", bytes.NewReader(body), mirror.Expect{}, mirror.Meta{ETag: `"old"`}); err != nil {
		t.Fatal(err)
	}
	if _, err := ft.Put(ctx, "k", strings.NewReader("bad"), mirror.Expect{SHA256: hexSum(body)}, mirror.Meta{ETag: `"new"`}); !errors.Is(err, mirror.ErrDigestMismatch) {
		t.Fatal(err)
	}
	st, err := ft.Stat(ctx, "k")
	if err != nil || st.ETag != `"old"` || st.SHA256 != hexSum(body) {
		t.Errorf("after a failed overwrite: %+v, %v", st, err)
	}
}

// slowReader hands out its bytes in small pieces with a pause, so a Put
// lasts long enough for readers to look at the object while it runs.
type slowReader struct {
	data  []byte
	pause time.Duration
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.pause)
	n := copy(p[:min(len(p), 4096)], r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestReaderNeverSeesPartialObject(t *testing.T) {
	ft := open(t)
	ctx := context.Background()
	versions := [][]byte{
		bytes.Repeat([]byte("A"), 64<<10),
		bytes.Repeat([]byte("B"), 96<<10),
		bytes.Repeat([]byte("C"), 32<<10),
	}
	whole := map[string]bool{}
	for _, v := range versions {
		whole[hexSum(v)] = true
	}
	if _, err := ft.Put(ctx, "obj", bytes.NewReader(versions[0]), mirror.Expect{}, mirror.Meta{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(ft.Root(), "obj")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, bad int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := os.ReadFile(path)
			reads++
			if err != nil || !whole[hexSum(b)] {
				bad++
			}
		}
	}()
	for _, v := range versions[1:] {
		if _, err := ft.Put(ctx, "obj", &slowReader{data: v, pause: time.Millisecond}, mirror.Expect{}, mirror.Meta{}); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
	if bad != 0 {
		t.Errorf("%d of %d reads saw a missing or partial object", bad, reads)
	}
	b, _ := os.ReadFile(path)
	if !bytes.Equal(b, versions[2]) {
		t.Error("the last version did not win")
	}
}

func TestOpenRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	ft, err := mirror.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ft.Put(context.Background(), "kept", strings.NewReader("x"), mirror.Expect{}, mirror.Meta{}); err != nil {
		t.Fatal(err)
	}
	// What a crash mid-Put leaves: temporary files, one in a stray dir.
	tmp := filepath.Join(dir, ".mirrorworker", "tmp")
	for _, name := range []string{"obj-123", "meta-456", "stray/obj-789"} {
		p := filepath.Join(tmp, filepath.FromSlash(name))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A live writer's file: locked the way a Put locks its own. The
	// others are what a killed process leaves, files no one locks.
	live := filepath.Join(tmp, "obj-live")
	lf, err := os.OpenFile(live, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if _, err := mirror.Open("file://" + filepath.ToSlash(dir)); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(tmp)
	if err != nil || len(entries) != 1 || entries[0].Name() != "obj-live" {
		t.Errorf("tmp after Open: %v, %v; want only obj-live", entries, err)
	}
	// Its writer dies: the kernel drops the lock, and the next Open
	// sweeps the file.
	lf.Close()
	if _, err := mirror.Open(dir); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(tmp); err != nil || len(entries) != 0 {
		t.Errorf("tmp after the writer died and Open: %v, %v", entries, err)
	}
	if _, err := ft.Stat(context.Background(), "kept"); err != nil {
		t.Errorf("a stored object was disturbed: %v", err)
	}
}

// TestOpenSparesAnotherWritersTemps opens a second FileTarget on a root
// while the first is in the middle of a Put (reading the body, or paused
// at a step with its temporary files written): the second's sweep must
// leave those files, and the Put must complete. A killed writer's files
// are swept (TestOpenRemovesStaleTemps, TestCrashDuringPut).
func TestOpenSparesAnotherWritersTemps(t *testing.T) {
	tests := []struct {
		name    string
		sidecar bool
		at      string // the Put's step to open the second target at; "": while it reads the body
		temps   int    // temporary files the Put has then
	}{
		{name: "reading the body", temps: 1},
		{name: "object written", at: mirror.FaultObjectWritten, temps: 1},
		{name: "object synced", at: mirror.FaultObjectSynced, temps: 1},
		{name: "sidecar written", sidecar: true, at: mirror.FaultSidecarWritten, temps: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			paused, resume := make(chan struct{}), make(chan struct{})
			pause := func() { close(paused); <-resume }
			o := &mirror.Options{Sidecar: tt.sidecar}
			if tt.at != "" {
				o.FaultHook = func(p string) {
					if p == tt.at {
						pause()
					}
				}
			}
			first, err := mirror.OpenWith(root, o)
			if err != nil {
				t.Fatal(err)
			}
			body := []byte("the first writer's object")
			var r io.Reader = bytes.NewReader(body)
			if tt.at == "" {
				r = io.MultiReader(bytes.NewReader(body[:4]), pausingReader{pause}, bytes.NewReader(body[4:]))
			}
			done := make(chan error, 1)
			go func() {
				_, err := first.Put(context.Background(), "k", r, mirror.Expect{}, mirror.Meta{})
				done <- err
			}()
			select {
			case <-paused:
			case err := <-done:
				t.Fatalf("Put ended before its pause: %v", err)
			}

			second, err := mirror.OpenWith(root, &mirror.Options{Sidecar: tt.sidecar})
			if err != nil {
				t.Fatal(err)
			}
			if _, temps := files(t, root); len(temps) != tt.temps {
				t.Errorf("the first writer's temporary files after the second Open: %v, want %d", temps, tt.temps)
			}
			close(resume)
			if err := <-done; err != nil {
				t.Fatalf("the first writer's Put: %v", err)
			}
			if m, err := second.Stat(context.Background(), "k"); err != nil || m.Size != int64(len(body)) {
				t.Errorf("the second target's Stat of the first's object: %+v, %v", m, err)
			}
			if _, temps := files(t, root); len(temps) != 0 {
				t.Errorf("temporary files after the Put: %v", temps)
			}
		})
	}
}

// TestPutsSurviveRepeatedOpens races a writer's Puts against another
// process's start-up sweeps, opened over and over on the same root: the
// moment between a temporary file's creation and its lock must not lose
// a Put either.
func TestPutsSurviveRepeatedOpens(t *testing.T) {
	root := t.TempDir()
	writer, err := mirror.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	const puts = 200
	done := make(chan error, 1)
	go func() {
		for i := range puts {
			key := fmt.Sprintf("d%d/k%d", i%4, i)
			if _, err := writer.Put(context.Background(), key, strings.NewReader(key), mirror.Expect{}, mirror.Meta{}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	opens := 0
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a Put after %d Opens: %v", opens, err)
			}
			if visible, temps := files(t, root); len(visible) != puts || len(temps) != 0 {
				t.Errorf("%d objects (want %d), temporary files %v", len(visible), puts, temps)
			}
			t.Logf("%d Puts beside %d Opens", puts, opens)
			return
		default:
		}
		if _, err := mirror.Open(root); err != nil {
			t.Fatal(err)
		}
		opens++
	}
}

// pausingReader calls pause at its first Read and then reports EOF, so
// that an io.MultiReader goes on to the rest of the body.
type pausingReader struct{ pause func() }

func (p pausingReader) Read([]byte) (int, error) {
	p.pause()
	return 0, io.EOF
}

func TestOpenSpec(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		spec string
		root string // "" means an error
	}{
		{spec: dir, root: dir},
		{spec: "file://" + filepath.ToSlash(dir), root: dir},
		{spec: "file://localhost" + filepath.ToSlash(dir), root: dir},
		{spec: ""},
		{spec: "file://host/dir"},
		{spec: "file:relative"},
		{spec: "s3://bucket/prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			ft, err := mirror.Open(tt.spec)
			if tt.root == "" {
				if err == nil {
					t.Errorf("Open(%q) = %s, want an error", tt.spec, ft.Root())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ft.Root() != tt.root {
				t.Errorf("Root %q, want %q", ft.Root(), tt.root)
			}
			for _, d := range []string{"tmp", "meta"} {
				if fi, err := os.Stat(filepath.Join(tt.root, ".mirrorworker", d)); err != nil || !fi.IsDir() {
					t.Errorf(".mirrorworker/%s: %v", d, err)
				}
			}
		})
	}
	// A relative path is made absolute.
	t.Chdir(dir)
	ft, err := mirror.Open("sub/mirror")
	if err != nil {
		t.Fatal(err)
	}
	if ft.Root() != filepath.Join(dir, "sub", "mirror") {
		t.Errorf("Root %q", ft.Root())
	}
}

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key string
		ok  bool
	}{
		{"files.example.org/a/b.tar.gz", true},
		{"files.example.org_8443/index", true},
		{"a", true},
		{"a b/ü/%2F", true},
		{".hidden/x", true},
		{"x/.mirrorworker/y", true},
		{".mirrorworkers/x", true},
		{strings.Repeat("a", 250), true},
		{strings.Repeat("a/", 511) + "aa", true}, // 1024 bytes
		{"", false},
		{"/abs", false},
		{"a//b", false},
		{"a/", false},
		{"./a", false},
		{"a/./b", false},
		{"a/..", false},
		{"../a", false},
		{"..", false},
		{"a\\b", false},
		{"a\x00b", false},
		{".mirrorworker", false},
		{".mirrorworker/meta/x.json", false},
		{".MirrorWorker/tmp/x", false},
		{strings.Repeat("a", 251), false},
		{strings.Repeat("a/", 511) + "aaa", false}, // 1025 bytes
	}
	for _, tt := range tests {
		name := tt.key
		if len(name) > 40 {
			name = fmt.Sprintf("%s...(%d bytes)", name[:20], len(name))
		}
		t.Run(name, func(t *testing.T) {
			err := mirror.ValidateKey(tt.key)
			if tt.ok != (err == nil) {
				t.Fatalf("ValidateKey: %v, want ok=%v", err, tt.ok)
			}
			if !tt.ok && !errors.Is(err, mirror.ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err)
			}
			ft := open(t)
			_, err = ft.Put(context.Background(), tt.key, strings.NewReader("x"), mirror.Expect{}, mirror.Meta{})
			if tt.ok != (err == nil) {
				t.Errorf("Put: %v, want ok=%v", err, tt.ok)
			}
			visible, temps := files(t, ft.Root())
			want := "[]"
			if tt.ok {
				want = "[" + tt.key + "]"
			}
			if fmt.Sprint(visible) != want || len(temps) != 0 {
				t.Errorf("visible %v temps %v", visible, temps)
			}
		})
	}
}

func TestKeyConflicts(t *testing.T) { forLayouts(t, testKeyConflicts) }

func testKeyConflicts(t *testing.T, o *mirror.Options) {
	ctx := context.Background()
	tests := []struct {
		name        string
		first, then string
		sidecarOnly bool
	}{
		{name: "object where a directory is needed", first: "a", then: "a/b"},
		{name: "deeper", first: "a/b", then: "a/b/c/d"},
		{name: "directory where an object would go", first: "a/b", then: "a"},
		{name: "metadata names collide", first: "a", then: "a.json/b", sidecarOnly: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ft := openWith(t, o)
			if tt.sidecarOnly && ft.MetadataInXattrs() {
				// Without sidecar files the names cannot collide:
				// both keys are stored.
				for _, key := range []string{tt.first, tt.then} {
					if _, err := ft.Put(ctx, key, strings.NewReader(key), mirror.Expect{}, mirror.Meta{}); err != nil {
						t.Fatal(err)
					}
					if _, err := ft.Stat(ctx, key); err != nil {
						t.Errorf("Stat(%q): %v", key, err)
					}
				}
				return
			}
			if _, err := ft.Put(ctx, tt.first, strings.NewReader("first"), mirror.Expect{}, mirror.Meta{}); err != nil {
				t.Fatal(err)
			}
			_, err := ft.Put(ctx, tt.then, strings.NewReader("then"), mirror.Expect{}, mirror.Meta{})
			if !errors.Is(err, mirror.ErrKeyConflict) {
				t.Fatalf("Put(%q) after Put(%q): %v, want ErrKeyConflict", tt.then, tt.first, err)
			}
			if _, err := ft.Stat(ctx, tt.first); err != nil {
				t.Errorf("first object disturbed: %v", err)
			}
			if _, err := ft.Stat(ctx, tt.then); !errors.Is(err, mirror.ErrNotFound) {
				t.Errorf("Stat(%q): %v", tt.then, err)
			}
			visible, temps := files(t, ft.Root())
			if fmt.Sprint(visible) != "["+tt.first+"]" || len(temps) != 0 {
				t.Errorf("visible %v temps %v", visible, temps)
			}
		})
	}
}

func TestConcurrentPutsDistinctKeys(t *testing.T) { forLayouts(t, testConcurrentPutsDistinctKeys) }

func testConcurrentPutsDistinctKeys(t *testing.T, o *mirror.Options) {
	ft := openWith(t, o)
	ctx := context.Background()
	const writers, each = 8, 10
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				// Siblings share parent directories that are being created.
				key := fmt.Sprintf("host/d%d/w%d-%d", i%3, w, i)
				body := []byte(key)
				if _, err := ft.Put(ctx, key, bytes.NewReader(body), mirror.Expect{SHA256: hexSum(body)}, mirror.Meta{JobID: key}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for w := range writers {
		for i := range each {
			key := fmt.Sprintf("host/d%d/w%d-%d", i%3, w, i)
			m, err := ft.Stat(ctx, key)
			b, _ := os.ReadFile(filepath.Join(ft.Root(), filepath.FromSlash(key)))
			if err != nil || m.JobID != key || string(b) != key {
				t.Errorf("Stat(%q) = %+v, %v; object %q", key, m, err, b)
			}
		}
	}
	if _, temps := files(t, ft.Root()); len(temps) != 0 {
		t.Errorf("temps left: %v", temps)
	}
}

func TestConcurrentPutsSameKey(t *testing.T) { forLayouts(t, testConcurrentPutsSameKey) }

func testConcurrentPutsSameKey(t *testing.T, o *mirror.Options) {
	ft := openWith(t, o)
	ctx := context.Background()
	const writers, rounds = 8, 40
	for round := range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				<-start
				// Sizes differ so that metadata paired with another
				// writer's object is caught by size as well as by job id.
				body := []byte(fmt.Sprintf("writer %d %s", w, strings.Repeat("x", w)))
				if _, err := ft.Put(ctx, "host/same", bytes.NewReader(body), mirror.Expect{}, mirror.Meta{JobID: fmt.Sprint(w)}); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		// Whichever writer won, the metadata describes its object.
		m, err := ft.Stat(ctx, "host/same")
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		b, err := os.ReadFile(filepath.Join(ft.Root(), "host", "same"))
		var w int
		if _, serr := fmt.Sscanf(string(b), "writer %d", &w); err != nil || serr != nil || hexSum(b) != m.SHA256 || m.JobID != fmt.Sprint(w) {
			t.Fatalf("round %d: meta %+v does not describe the object %q", round, m, b)
		}
	}
	if _, temps := files(t, ft.Root()); len(temps) != 0 {
		t.Errorf("temps left: %v", temps)
	}
}

func BenchmarkPutSmall(b *testing.B) {
	// Each Put syncs the object, the metadata and their directories: the
	// figure measures the disk's fsync latency far more than this code.
	ft := open(b)
	ctx := context.Background()
	body := bytes.Repeat([]byte("m"), 4<<10)
	b.SetBytes(int64(len(body)))
	i := 0
	for b.Loop() {
		key := fmt.Sprintf("host/d%d/obj-%d", i%16, i)
		i++
		if _, err := ft.Put(ctx, key, bytes.NewReader(body), mirror.Expect{}, mirror.Meta{URL: "https://host/" + key}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutSmallParallel is BenchmarkPutSmall with 16 goroutines per
// CPU storing into 16 directories, as a worker with many fetches in flight
// does: concurrent Puts into one directory share its fsync.
func BenchmarkPutSmallParallel(b *testing.B) {
	benchPutParallel(b, func(i int64) string { return fmt.Sprintf("host/d%d/obj-%d", i%16, i) })
}

// BenchmarkPutNewDirectories is BenchmarkPutSmallParallel with every Put
// into a directory of its own, new under one parent: a worker's first job
// for each of many authorities. New directories share their parent's fsync
// (ADR 0036).
func BenchmarkPutNewDirectories(b *testing.B) {
	benchPutParallel(b, func(i int64) string { return fmt.Sprintf("a%d/obj-%d", i, i) })
}

// benchPutParallel stores 4 KiB objects from 16 goroutines per CPU, the
// i-th under keyOf(i).
func benchPutParallel(b *testing.B, keyOf func(i int64) string) {
	ft := open(b)
	ctx := context.Background()
	body := bytes.Repeat([]byte("m"), 4<<10)
	b.SetBytes(int64(len(body)))
	b.SetParallelism(16)
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := keyOf(n.Add(1))
			if _, err := ft.Put(ctx, key, bytes.NewReader(body), mirror.Expect{}, mirror.Meta{URL: "https://host/" + key}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestObjectsAreReadableByAllWhateverTheUmask: objects are published to
// readers (0644) under any umask. createTemp chmods only when the umask
// narrowed the mode given to open, so a narrowing umask is the case that
// needs it. Not parallel: the umask is the process's.
func TestObjectsAreReadableByAllWhateverTheUmask(t *testing.T) {
	for _, tc := range []struct {
		name  string
		umask int
	}{
		{name: "usual", umask: 0o022},
		{name: "none", umask: 0},
		{name: "owner only", umask: 0o077},
		{name: "no read for others", umask: 0o026},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forLayouts(t, func(t *testing.T, o *mirror.Options) {
				ft := openWith(t, o)
				old := syscall.Umask(tc.umask)
				defer syscall.Umask(old)
				if _, err := ft.Put(context.Background(), "h/d/obj", strings.NewReader("bytes"), mirror.Expect{}, mirror.Meta{}); err != nil {
					t.Fatal(err)
				}
				fi, err := os.Lstat(filepath.Join(ft.Root(), "h", "d", "obj"))
				if err != nil {
					t.Fatal(err)
				}
				if got := fi.Mode().Perm(); got != 0o644 {
					t.Errorf("object mode %v under umask %#o, want -rw-r--r--", got, tc.umask)
				}
			})
		})
	}
}
