package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/sumindex"
)

// TestVerifyRebuildsTheIndex: verify's rebuild drops an entry whose key
// is gone, points an entry at a key that holds its bytes, and says so; a
// file target's index that a worker holds is left alone, and said so.
func TestVerifyRebuildsTheIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	ft, err := mirror.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	idx, err := sumindex.OpenBolt(sumindex.BoltPath(ft.Root()), 0)
	if err != nil {
		t.Fatal(err)
	}
	tgt := sumindex.Wrap(ft, idx, zerolog.Nop())
	for _, o := range []struct{ key, body string }{{"a", "X"}, {"b", "X"}, {"c", "Y"}} {
		if _, err := tgt.Put(ctx, o.key, strings.NewReader(o.body), mirror.Expect{}, mirror.Meta{}); err != nil {
			t.Fatal(err)
		}
	}
	// Damage: an entry for bytes no object holds, one naming the wrong key.
	if err := idx.Add(ctx, sum("Z"), "gone"); err != nil {
		t.Fatal(err)
	}
	if err := idx.Add(ctx, sum("Y"), "a"); err != nil {
		t.Fatal(err)
	}

	res, err := audit(ctx, ft, nil, nil, newVerifyProgress(io.Discard, 0, time.Now))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := rebuildIndex(ctx, &out, ft, res.sums); err != nil {
		t.Fatal(err)
	}
	if want := "sha256 index " + sumindex.BoltPath(ft.Root()) + " not rebuilt: a running worker holds it\n"; out.String() != want {
		t.Errorf("rebuild beside a holder said %q, want %q", out.String(), want)
	}

	idx.Close()
	out.Reset()
	if err := rebuildIndex(ctx, &out, ft, res.sums); err != nil {
		t.Fatal(err)
	}
	if want := "sha256 index rebuilt: 2 entries; 0 added, 1 stale dropped, 1 pointed at another key\n"; out.String() != want {
		t.Errorf("rebuild said %q, want %q", out.String(), want)
	}
	idx, err = sumindex.OpenBolt(sumindex.BoltPath(ft.Root()), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	for s, want := range map[string]string{sum("X"): "a", sum("Y"): "c"} {
		if k, err := idx.Lookup(ctx, s); err != nil || k != want {
			t.Errorf("entry %q (%v), want %q", k, err, want)
		}
	}
	if n, _ := idx.Len(); n != 2 {
		t.Errorf("%d entries after the rebuild, want 2", n)
	}
}
