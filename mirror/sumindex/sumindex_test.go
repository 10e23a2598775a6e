package sumindex_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/sumindex"
)

func hexSHA(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func open(t testing.TB) (*mirror.FileTarget, *sumindex.Bolt, *sumindex.Target) {
	t.Helper()
	ft, err := mirror.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	idx, err := sumindex.OpenBolt(sumindex.BoltPath(ft.Root()), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	return ft, idx, sumindex.Wrap(ft, idx, zerolog.Nop())
}

func read(t *testing.T, ft *mirror.FileTarget, key string) string {
	t.Helper()
	b, err := os.ReadFile(ft.Root() + "/" + key)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCopyKnown(t *testing.T) {
	ctx := context.Background()
	body := "the bytes of one release"
	sum := hexSHA([]byte(body))
	tests := []struct {
		name string
		// setup runs on a target that holds body under "orig" (through the
		// index) before the copy to "dup" is asked for.
		setup    func(t *testing.T, ft *mirror.FileTarget, idx *sumindex.Bolt)
		want     mirror.Expect
		copied   bool
		entryFor string // the key the entry names afterwards; "" none
	}{
		{name: "copied", want: mirror.Expect{SHA256: sum}, copied: true, entryFor: "orig"},
		{name: "copied with size", want: mirror.Expect{SHA256: strings.ToUpper(sum), Size: int64(len(body)), HasSize: true}, copied: true, entryFor: "orig"},
		{name: "no sha256", want: mirror.Expect{}, entryFor: "orig"},
		{name: "no entry", want: mirror.Expect{SHA256: hexSHA([]byte("other"))}, entryFor: "orig"},
		{name: "size differs", want: mirror.Expect{SHA256: sum, Size: 3, HasSize: true}},
		{
			name: "source replaced", want: mirror.Expect{SHA256: sum},
			setup: func(t *testing.T, ft *mirror.FileTarget, _ *sumindex.Bolt) {
				if _, err := ft.Put(ctx, "orig", strings.NewReader("new bytes"), mirror.Expect{}, mirror.Meta{}); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "source removed", want: mirror.Expect{SHA256: sum},
			setup: func(t *testing.T, ft *mirror.FileTarget, _ *sumindex.Bolt) {
				if err := ft.Remove(ctx, "orig"); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "source changed in place", want: mirror.Expect{SHA256: sum},
			setup: func(t *testing.T, ft *mirror.FileTarget, _ *sumindex.Bolt) {
				// Same size, other bytes, metadata untouched: only the hash
				// of the copy's bytes can tell.
				if err := os.WriteFile(ft.Root()+"/orig", []byte(strings.ToUpper(body)), 0o644); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "entry names the key itself", want: mirror.Expect{SHA256: sum},
			setup: func(t *testing.T, _ *mirror.FileTarget, idx *sumindex.Bolt) {
				if err := idx.Add(ctx, sum, "dup"); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ft, idx, tgt := open(t)
			if _, err := tgt.Put(ctx, "orig", strings.NewReader(body), mirror.Expect{}, mirror.Meta{URL: "http://o/orig", ETag: `"e"`}); err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(t, ft, idx)
			}
			from, m, err := tgt.CopyKnown(ctx, "dup", tc.want, mirror.Meta{URL: "http://u:p@o/dup", JobID: "j"})
			if !tc.copied {
				if !errors.Is(err, sumindex.ErrNoCopy) {
					t.Fatalf("CopyKnown: %v, want ErrNoCopy", err)
				}
				if _, err := ft.Stat(ctx, "dup"); !errors.Is(err, mirror.ErrNotFound) {
					t.Errorf("dup stored (%v) though nothing was copied", err)
				}
			} else {
				if err != nil || from != "orig" {
					t.Fatalf("CopyKnown: from %q, %v", from, err)
				}
				if got := read(t, ft, "dup"); got != body {
					t.Errorf("dup holds %q", got)
				}
				if m.SHA256 != sum || m.Size != int64(len(body)) || m.URL != "http://o/dup" || m.ETag != "" || m.JobID != "j" {
					t.Errorf("meta %+v", m)
				}
				if st, err := ft.Stat(ctx, "dup"); err != nil || st.SHA256 != sum || st.URL != "http://o/dup" {
					t.Errorf("stored meta %+v, %v", st, err)
				}
				if got := read(t, ft, "orig"); got != body {
					t.Errorf("orig holds %q after the copy", got)
				}
			}
			k, err := idx.Lookup(ctx, sum)
			switch {
			case tc.entryFor == "" && !errors.Is(err, mirror.ErrNotFound):
				t.Errorf("entry %q (%v) left, want it forgotten", k, err)
			case tc.entryFor != "" && k != tc.entryFor:
				t.Errorf("entry names %q (%v), want %q", k, err, tc.entryFor)
			}
		})
	}
}

// TestCopiesAreSeparateFiles: a copy is its own inode, so a later Put to
// either name leaves the other's bytes and metadata alone.
func TestCopiesAreSeparateFiles(t *testing.T) {
	ctx := context.Background()
	ft, _, tgt := open(t)
	body := "shared"
	if _, err := tgt.Put(ctx, "a", strings.NewReader(body), mirror.Expect{}, mirror.Meta{URL: "http://o/a"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tgt.CopyKnown(ctx, "b", mirror.Expect{SHA256: hexSHA([]byte(body))}, mirror.Meta{URL: "http://o/b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tgt.Put(ctx, "a", strings.NewReader("changed"), mirror.Expect{}, mirror.Meta{URL: "http://o/a2"}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, ft, "b"); got != body {
		t.Errorf("b holds %q after a's overwrite", got)
	}
	if m, err := ft.Stat(ctx, "b"); err != nil || m.URL != "http://o/b" {
		t.Errorf("b's meta %+v, %v", m, err)
	}
}

// TestPutKeepsAGoodEntry: storing the same bytes under a second name by a
// fetch leaves the entry on the first, which still holds them.
func TestPutKeepsAGoodEntry(t *testing.T) {
	ctx := context.Background()
	_, idx, tgt := open(t)
	for _, k := range []string{"first", "second"} {
		if _, err := tgt.Put(ctx, k, strings.NewReader("same"), mirror.Expect{}, mirror.Meta{}); err != nil {
			t.Fatal(err)
		}
	}
	if k, err := idx.Lookup(ctx, hexSHA([]byte("same"))); err != nil || k != "first" {
		t.Errorf("entry %q, %v; want first", k, err)
	}
}

// statCounter is a file target that counts its Stats.
type statCounter struct {
	*mirror.FileTarget
	stats atomic.Int64
}

func (s *statCounter) Stat(ctx context.Context, key string) (mirror.Meta, error) {
	s.stats.Add(1)
	return s.FileTarget.Stat(ctx, key)
}

// TestPutLeavesAStaleEntryToTheCopy: a Put of bytes the index already
// names under another key reads nothing of that key, even when it no longer
// holds them; the next copy that meets the stale entry forgets it, and the
// job, fetched instead, lands byte-exact and names itself in the index.
func TestPutLeavesAStaleEntryToTheCopy(t *testing.T) {
	ctx := context.Background()
	ft, idx, _ := open(t)
	sc := &statCounter{FileTarget: ft}
	tgt := sumindex.Wrap(sc, idx, zerolog.Nop())
	body := "same bytes"
	sum := hexSHA([]byte(body))
	put := func(key, b string) {
		t.Helper()
		if _, err := tgt.Put(ctx, key, strings.NewReader(b), mirror.Expect{}, mirror.Meta{}); err != nil {
			t.Fatal(err)
		}
	}
	put("first", body)
	put("first", "other bytes now") // the entry for body goes stale
	put("second", body)
	if n := sc.stats.Load(); n != 0 {
		t.Errorf("Puts read %d keys' metadata, want none", n)
	}
	if k, err := idx.Lookup(ctx, sum); err != nil || k != "first" {
		t.Fatalf("entry %q, %v; want the stale one left, first", k, err)
	}
	want := mirror.Expect{SHA256: sum}
	if _, _, err := tgt.CopyKnown(ctx, "third", want, mirror.Meta{}); !errors.Is(err, sumindex.ErrNoCopy) {
		t.Fatalf("copy from a stale entry: %v, want ErrNoCopy", err)
	}
	if _, err := ft.Stat(ctx, "third"); !errors.Is(err, mirror.ErrNotFound) {
		t.Errorf("third stored (%v) from a stale entry", err)
	}
	if k, err := idx.Lookup(ctx, sum); !errors.Is(err, mirror.ErrNotFound) {
		t.Fatalf("entry %q, %v; want the stale one forgotten", k, err)
	}
	// The job is fetched instead: its Put lands and records it.
	if _, err := tgt.Put(ctx, "third", strings.NewReader(body), want, mirror.Meta{}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, ft, "third"); got != body {
		t.Errorf("third holds %q", got)
	}
	from, _, err := tgt.CopyKnown(ctx, "fourth", want, mirror.Meta{})
	if err != nil || from != "third" {
		t.Fatalf("copy after the fetch: from %q, %v; want third", from, err)
	}
	if got := read(t, ft, "fourth"); got != body {
		t.Errorf("fourth holds %q", got)
	}
}

// TestSecondProcessIsRefused: the file is one process's at a time; a
// second open waits, then says who is in the way.
func TestSecondProcessIsRefused(t *testing.T) {
	ft, _, _ := open(t)
	// bbolt's flock is per open file description, so a second open in
	// this process conflicts as another process's would.
	_, err := sumindex.OpenBolt(sumindex.BoltPath(ft.Root()), 50e6)
	if !errors.Is(err, sumindex.ErrHeld) {
		t.Fatalf("second open: %v, want ErrHeld", err)
	}
}

func TestReplace(t *testing.T) {
	ctx := context.Background()
	_, idx, _ := open(t)
	s := func(i int) string { return hexSHA([]byte(fmt.Sprint(i))) }
	for i, k := range []string{"k0", "k1", "k2"} {
		if err := idx.Add(ctx, s(i), k); err != nil {
			t.Fatal(err)
		}
	}
	added, dropped, changed, err := idx.Replace(ctx, []sumindex.Entry{{s(0), "k0"}, {s(1), "moved"}, {s(3), "k3"}})
	if err != nil || added != 1 || dropped != 1 || changed != 1 {
		t.Fatalf("Replace: added %d dropped %d changed %d, %v; want 1 1 1", added, dropped, changed, err)
	}
	if n, _ := idx.Len(); n != 3 {
		t.Errorf("%d entries, want 3", n)
	}
	if _, err := idx.Lookup(ctx, s(2)); !errors.Is(err, mirror.ErrNotFound) {
		t.Errorf("dropped entry: %v", err)
	}
}

// millionEntries are the entries of a million objects: keys of 40-odd
// bytes, as a package mirror's paths are.
func millionEntries() []sumindex.Entry {
	entries := make([]sumindex.Entry, 1_000_000)
	for i := range entries {
		entries[i] = sumindex.Entry{
			Sum: hexSHA([]byte(fmt.Sprint(i))),
			Key: fmt.Sprintf("packages/%02x/%02x/artifact-%07d.tar.gz", i%256, (i/256)%256, i),
		}
	}
	return entries
}

// BenchmarkMillionEntries measures the index of a million objects: the
// file's size on disk, the Go heap an open index holds after a lookup of
// one entry in 97, and a lookup's time. "added" fills it as a worker does,
// one Add per stored object (in random digest order; 1,000 goroutines, so
// that bbolt's Batch commits up to 1,000 at once); "rebuilt" as verify
// does (Replace, in key order, full pages).
//
//	go test ./mirror/sumindex -run '^$' -bench MillionEntries -benchtime 1x
func BenchmarkMillionEntries(b *testing.B) {
	ctx := context.Background()
	entries := millionEntries()
	fill := map[string]func(b *testing.B, idx *sumindex.Bolt){
		"added": func(b *testing.B, idx *sumindex.Bolt) {
			var wg sync.WaitGroup
			var failed atomic.Value
			const workers = 1000
			for w := range workers {
				wg.Go(func() {
					for i := w; i < len(entries); i += workers {
						if err := idx.Add(ctx, entries[i].Sum, entries[i].Key); err != nil {
							failed.Store(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if err, _ := failed.Load().(error); err != nil {
				b.Fatal(err)
			}
		},
		"rebuilt": func(b *testing.B, idx *sumindex.Bolt) {
			if _, _, _, err := idx.Replace(ctx, entries); err != nil {
				b.Fatal(err)
			}
		},
	}
	for _, name := range []string{"rebuilt", "added"} {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				path := b.TempDir() + "/" + sumindex.FileName
				idx, err := sumindex.OpenBolt(path, 0)
				if err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				fill[name](b, idx)
				took := time.Since(t0)
				idx.Close()
				runtime.GC()
				runtime.GC()
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				if idx, err = sumindex.OpenBolt(path, 0); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				n := 0
				for i := 0; i < len(entries); i += 97 {
					if _, err := idx.Lookup(ctx, entries[i].Sum); err != nil {
						b.Fatal(err)
					}
					n++
				}
				lookup := time.Since(t1) / time.Duration(n)
				runtime.GC()
				runtime.GC()
				var after runtime.MemStats
				runtime.ReadMemStats(&after)
				fi, err := os.Stat(path)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(fi.Size())/(1<<20), "MiB-file")
				b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "MiB-heap-open")
				b.ReportMetric(took.Seconds(), "s-to-fill")
				b.ReportMetric(float64(lookup.Nanoseconds()), "ns/lookup")
				idx.Close()
			}
		})
	}
}

// TestAddsAreSeenAtOnceAndCommittedInOrder: an Add returns before its
// commit (Bolt.CommitDelay), yet Lookup sees it at once; a Forget after
// it wins over it, in memory and on disk; and Close commits what waits.
func TestAddsAreSeenAtOnceAndCommittedInOrder(t *testing.T) {
	ctx := context.Background()
	path := sumindex.BoltPath(t.TempDir())
	idx, err := sumindex.OpenBolt(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	kept, forgotten, moved := hexSHA([]byte("kept")), hexSHA([]byte("forgotten")), hexSHA([]byte("moved"))
	for _, e := range []sumindex.Entry{{kept, "a"}, {forgotten, "b"}, {moved, "c"}, {moved, "d"}} {
		if err := idx.Add(ctx, e.Sum, e.Key); err != nil {
			t.Fatal(err)
		}
	}
	// Well within CommitDelay of the Adds, unless the machine stalls; the
	// checks hold either way.
	if k, err := idx.Lookup(ctx, kept); err != nil || k != "a" {
		t.Errorf("Lookup right after Add: %q, %v; want a", k, err)
	}
	if err := idx.Forget(ctx, forgotten, "b"); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for _, c := range []struct {
			name, sum, want string
		}{
			{name: "kept", sum: kept, want: "a"},
			{name: "forgotten", sum: forgotten},
			{name: "moved", sum: moved, want: "d"},
		} {
			k, err := idx.Lookup(ctx, c.sum)
			switch {
			case c.want == "" && !errors.Is(err, mirror.ErrNotFound):
				t.Errorf("%s: %s: %q, %v; want no entry", when, c.name, k, err)
			case c.want != "" && (err != nil || k != c.want):
				t.Errorf("%s: %s: %q, %v; want %q", when, c.name, k, err, c.want)
			}
		}
	}
	check("after the Forget")
	if err := idx.Add(ctx, hexSHA([]byte("last")), "e"); err != nil {
		t.Fatal(err)
	}
	if err := idx.Close(); err != nil {
		t.Fatal(err)
	}
	if idx, err = sumindex.OpenBolt(path, 0); err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	check("reopened")
	if k, err := idx.Lookup(ctx, hexSHA([]byte("last"))); err != nil || k != "e" {
		t.Errorf("reopened: the Add just before Close: %q, %v; want e", k, err)
	}
	if n, err := idx.Len(); err != nil || n != 3 {
		t.Errorf("reopened: %d entries, %v; want 3", n, err)
	}
}

// TestAnAddIsCommittedWithoutAFlush: the committer commits on its own,
// with no Close, Len or Forget to make it. The file is held by this
// handle, and Len would flush, so the entry is looked for in copies of
// the file taken while the handle stays open.
func TestAnAddIsCommittedWithoutAFlush(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := sumindex.BoltPath(dir)
	idx, err := sumindex.OpenBolt(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	sum := hexSHA([]byte("on its own"))
	if err := idx.Add(ctx, sum, "k"); err != nil {
		t.Fatal(err)
	}
	cp := dir + "/copy.db"
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cp, data, 0o644); err != nil {
			t.Fatal(err)
		}
		// A copy taken during a commit may not open; the next one will.
		c, lerr := sumindex.OpenBolt(cp, 0)
		if lerr == nil {
			var k string
			k, lerr = c.Lookup(ctx, sum)
			c.Close()
			if lerr == nil && k == "k" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the entry is not in the file %v after its Add: %v", 30*time.Second, lerr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
