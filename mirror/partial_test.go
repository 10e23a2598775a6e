package mirror_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
)

// cutReader yields data[:n], then err: a body whose transfer failed.
func cutReader(data []byte, n int, err error) io.Reader {
	return io.MultiReader(bytes.NewReader(data[:n]), &failingReader{err: err})
}

var errCut = errors.New("connection reset by peer")

// partials lists the files waiting under the reserved partial directory.
func partials(t *testing.T, ft *mirror.FileTarget) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(ft.Root(), mirror.ReservedDir, "partial"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// TestPutKeepsWhatAFailedBodyBrought: a body cut after enough bytes of an
// answer with a strong validator leaves its bytes for the next attempt,
// which finds them by key and URL, asks for the rest and stores the whole
// body, its sha256 and size checked over all of it; what cannot be
// resumed is never kept or is dropped.
func TestPutKeepsWhatAFailedBodyBrought(t *testing.T) {
	data := bytes.Repeat([]byte("resume me, "), 8000) // 88000 bytes
	want := mirror.Expect{SHA256: hexSum(data), Size: int64(len(data)), HasSize: true}
	const url, key = "http://origin.test/big", "big/obj"
	meta := func(etag, lastMod string) mirror.Meta {
		return mirror.Meta{URL: url, ETag: etag, LastModified: lastMod, JobID: "j1"}
	}
	tests := []struct {
		name     string
		meta     mirror.Meta
		cut      int
		resumeAt string // URL the retry resumes for
		wantKept int64  // 0: nothing found
	}{
		{name: "strong etag", meta: meta(`"v1"`, ""), cut: 80000, resumeAt: url, wantKept: 80000},
		{name: "last-modified only", meta: meta("", "Mon, 02 Jan 2006 15:04:05 GMT"), cut: 80000, resumeAt: url, wantKept: 80000},
		{name: "weak etag", meta: meta(`W/"v1"`, "Mon, 02 Jan 2006 15:04:05 GMT"), cut: 80000, resumeAt: url},
		{name: "no validator", meta: meta("", ""), cut: 80000, resumeAt: url},
		{name: "below ResumeMin", meta: meta(`"v1"`, ""), cut: 1000, resumeAt: url},
		{name: "another url", meta: meta(`"v1"`, ""), cut: 80000, resumeAt: "http://origin.test/other"},
		{name: "every byte expected, then an error", meta: meta(`"v1"`, ""), cut: len(data), resumeAt: url},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ft := openWith(t, &mirror.Options{ResumeMin: 4096})
			ctx := context.Background()
			if _, err := ft.Put(ctx, key, cutReader(data, tc.cut, errCut), want, tc.meta); !errors.Is(err, errCut) {
				t.Fatalf("Put of a cut body: %v, want the body's error", err)
			}
			if _, temps := files(t, ft.Root()); len(temps) > 0 {
				t.Errorf("temporary files left: %v", temps)
			}
			k, err := ft.Resume(ctx, key, tc.resumeAt)
			if err != nil {
				t.Fatalf("Resume: %v", err)
			}
			if tc.wantKept == 0 {
				if k != nil {
					t.Fatalf("Resume found %+v, want nothing", k.Partial())
				}
				if p := partials(t, ft); len(p) > 0 {
					t.Errorf("partial files left: %v", p)
				}
				return
			}
			if k == nil {
				t.Fatal("Resume found nothing")
			}
			p := k.Partial()
			if p.Size != tc.wantKept || p.IfRange() != mirror.ResumeValidator(tc.meta.ETag, tc.meta.LastModified) {
				t.Fatalf("kept %+v (If-Range %q), want %d bytes", p, p.IfRange(), tc.wantKept)
			}
			m, err := ft.PutResume(ctx, key, k, p.Size, bytes.NewReader(data[p.Size:]), want, tc.meta)
			if err != nil {
				t.Fatalf("PutResume: %v", err)
			}
			if m.SHA256 != want.SHA256 || m.Size != want.Size {
				t.Errorf("stored sha256 %s size %d, want the whole body's", m.SHA256, m.Size)
			}
			got, err := os.ReadFile(filepath.Join(ft.Root(), key))
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("stored object differs from the body (%v)", err)
			}
			if p := partials(t, ft); len(p) > 0 {
				t.Errorf("partial files left after the store: %v", p)
			}
		})
	}
}

// TestResumeLifecycle follows one kept start through what attempts do
// with it: a second writer of the key does not get it while one holds
// it; Release gives it back; a resumed attempt that fails again keeps
// every byte so far; a whole body (the origin ignored the range) replaces
// it; a digest mismatch keeps nothing; it survives a restart (Open) but
// not PartialMaxAge.
func TestResumeLifecycle(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 10000) // 100000 bytes
	want := mirror.Expect{SHA256: hexSum(data), Size: int64(len(data)), HasSize: true}
	const url, key = "http://origin.test/big", "obj"
	meta := mirror.Meta{URL: url, ETag: `"v1"`}
	ctx := context.Background()
	root := t.TempDir()
	opt := &mirror.Options{ResumeMin: 4096}
	ft, err := mirror.OpenWith(root, opt)
	if err != nil {
		t.Fatal(err)
	}
	resume := func(ft *mirror.FileTarget) mirror.Kept {
		t.Helper()
		k, err := ft.Resume(ctx, key, url)
		if err != nil {
			t.Fatalf("Resume: %v", err)
		}
		return k
	}
	if _, err := ft.Put(ctx, key, cutReader(data, 30000, errCut), want, meta); !errors.Is(err, errCut) {
		t.Fatalf("Put: %v", err)
	}

	k := resume(ft)
	if k == nil || k.Partial().Size != 30000 {
		t.Fatalf("kept %v, want 30000 bytes", k)
	}
	if other := resume(ft); other != nil {
		t.Fatalf("a second writer got the start another attempt holds: %+v", other.Partial())
	}
	// A restart's sweep of the temporary files spares the held start.
	if _, err := mirror.OpenWith(root, opt); err != nil {
		t.Fatal(err)
	}
	k.Release()

	k = resume(ft)
	if k == nil || k.Partial().Size != 30000 {
		t.Fatalf("after Release: kept %v, want 30000 bytes", k)
	}
	// The resumed attempt fails too, 20000 bytes further.
	if _, err := ft.PutResume(ctx, key, k, 30000, cutReader(data[30000:], 20000, errCut), want, meta); !errors.Is(err, errCut) {
		t.Fatalf("PutResume of a cut rest: %v", err)
	}
	// A restart keeps it.
	ft, err = mirror.OpenWith(root, opt)
	if err != nil {
		t.Fatal(err)
	}
	k = resume(ft)
	if k == nil || k.Partial().Size != 50000 {
		t.Fatalf("after a second cut and a restart: kept %v, want 50000 bytes", k)
	}
	// Other bytes than the job's: nothing is stored, nothing kept.
	bad := bytes.Clone(data)
	bad[len(bad)-1] ^= 1
	if _, err := ft.PutResume(ctx, key, k, 50000, bytes.NewReader(bad[50000:]), want, meta); !errors.Is(err, mirror.ErrDigestMismatch) {
		t.Fatalf("PutResume of other bytes: %v, want ErrDigestMismatch", err)
	}
	if k := resume(ft); k != nil {
		t.Fatalf("kept %+v after a digest mismatch", k.Partial())
	}

	// The origin ignored the range: the whole body replaces the start.
	if _, err := ft.Put(ctx, key, cutReader(bad, 40000, errCut), mirror.Expect{}, meta); !errors.Is(err, errCut) {
		t.Fatalf("Put: %v", err)
	}
	k = resume(ft)
	if _, err := ft.PutResume(ctx, key, k, 0, bytes.NewReader(data), want, meta); err != nil {
		t.Fatalf("PutResume of a whole body: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, key)); !bytes.Equal(got, data) {
		t.Error("stored object differs from the whole body")
	}

	// Discarded: gone. Kept too long: swept at Open.
	if _, err := ft.Put(ctx, key, cutReader(data, 40000, errCut), want, meta); !errors.Is(err, errCut) {
		t.Fatalf("Put: %v", err)
	}
	resume(ft).Discard()
	if p := partials(t, ft); len(p) > 0 {
		t.Errorf("partial files left after Discard: %v", p)
	}
	if _, err := ft.Put(ctx, key, cutReader(data, 40000, errCut), want, meta); !errors.Is(err, errCut) {
		t.Fatalf("Put: %v", err)
	}
	if _, err := mirror.OpenWith(root, &mirror.Options{ResumeMin: 4096, PartialMaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if len(partials(t, ft)) != 1 {
		t.Fatal("a fresh start was swept")
	}
	for _, name := range partials(t, ft) {
		old := time.Now().Add(-2 * time.Hour)
		if err := os.Chtimes(filepath.Join(root, mirror.ReservedDir, "partial", name), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mirror.OpenWith(root, &mirror.Options{ResumeMin: 4096, PartialMaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if p := partials(t, ft); len(p) > 0 {
		t.Errorf("starts older than PartialMaxAge left at Open: %v", p)
	}
}

// TestResumeLooksOnlyForWhatItKnows: Resume opens the kept file of a key
// only if this process kept it or found it at Open, so that the jobs with
// nothing kept (nearly all) cost no failed open each. A file another
// process keeps after this one opened the root is not resumed here (the
// body comes whole); a process opened after it resumes it.
func TestResumeLooksOnlyForWhatItKnows(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 10000)
	want := mirror.Expect{SHA256: hexSum(data), Size: int64(len(data)), HasSize: true}
	const url, key = "http://origin.test/big", "obj"
	meta := mirror.Meta{URL: url, ETag: `"v1"`}
	ctx := context.Background()
	root := t.TempDir()
	opt := &mirror.Options{ResumeMin: 4096}
	open := func() *mirror.FileTarget {
		t.Helper()
		ft, err := mirror.OpenWith(root, opt)
		if err != nil {
			t.Fatal(err)
		}
		return ft
	}
	earlier, keeper := open(), open()
	if _, err := keeper.Put(ctx, key, cutReader(data, 60000, errCut), want, meta); !errors.Is(err, errCut) {
		t.Fatalf("Put of a cut body: %v", err)
	}
	tests := []struct {
		name  string
		ft    *mirror.FileTarget
		found bool
	}{
		{name: "opened before the keep", ft: earlier, found: false},
		{name: "opened after the keep", ft: open(), found: true},
		{name: "the keeper", ft: keeper, found: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := tc.ft.Resume(ctx, key, url)
			if err != nil {
				t.Fatalf("Resume: %v", err)
			}
			if (k != nil) != tc.found {
				t.Fatalf("Resume found %v, want %v", k != nil, tc.found)
			}
			if k == nil {
				return
			}
			if k.Partial().Size != 60000 {
				t.Errorf("kept %d bytes, want 60000", k.Partial().Size)
			}
			k.Release() // for the next case
		})
	}
}
