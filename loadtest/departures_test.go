package loadtest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestDepartureLogsMergeAcrossPods: two pods each keep a polite 100 ms
// spacing to one authority in their own log, but interleaved they sent
// pairs 30 ms apart; merged, the load test counts every such pair. A line
// cut short by a kill is skipped, and a pod that sent nothing has no file.
func TestDepartureLogsMergeAcrossPods(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pods := []struct {
		path   string
		offset time.Duration
	}{
		{filepath.Join(dir, "pod1"), 0},
		{filepath.Join(dir, "pod2"), 30 * time.Millisecond},
	}
	for _, p := range pods {
		l, err := departlog.Open(p.path)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			l.Record("127.0.0.1:8001", t0.Add(p.offset+time.Duration(i)*100*time.Millisecond))
		}
		l.Record("127.0.0.1:8002", t0.Add(p.offset)) // one each: 30 ms apart
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(pods[1].path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("1767225600000000000 127.0.0.1:80") // killed mid-line
	f.Close()

	d := newDepartures()
	for _, p := range pods {
		n, err := d.readDepartureLog(filepath.Base(p.path), p.path)
		if err != nil || n != 6 {
			t.Fatalf("%s: %d departures, err %v; want 6", p.path, n, err)
		}
	}
	if n, err := d.readDepartureLog("idle-pod", filepath.Join(dir, "idle-pod")); n != 0 || err != nil {
		t.Fatalf("missing log: %d, %v; want 0, nil", n, err)
	}
	// 8001: 0, 30, 100, 130, ... 430: 9 gaps, 5 of 30 ms and 4 of 70 ms;
	// 8002: one gap of 30 ms.
	below, minGap := d.belowFloor(100 * time.Millisecond)
	if below != 10 || minGap != 30*time.Millisecond {
		t.Errorf("belowFloor = %d, %v; want 10, 30ms", below, minGap)
	}
	if below, _ := d.belowFloor(50 * time.Millisecond); below != 6 {
		t.Errorf("below 50ms: %d, want 6", below)
	}
	var nilLog *departlog.Log
	var d0 worker.Deps
	if d0.Fetcher, d0.Pacer = nilLog.Wrap(d0.Fetcher, d0.Pacer); d0.Fetcher != nil || d0.Pacer != nil || nilLog.Close() != nil {
		t.Error("a nil departlog.Log must wrap nothing and close cleanly")
	}
	if l, err := departlog.Open(""); l != nil || err != nil {
		t.Errorf("departlog.Open(\"\") = %v, %v; want nil, nil", l, err)
	}
}
