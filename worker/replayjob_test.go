package worker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestSchedulerLiveFirst: an authority's replay jobs go after its live
// ones, one request in LiveFirstRun+1 while live jobs wait, and every
// request when none do; a live job admitted behind a queue of replay jobs
// is the next one granted.
func TestSchedulerLiveFirst(t *testing.T) {
	tests := []struct {
		name      string
		live, bg  int
		lateLive  int // live jobs admitted after the first grant
		wantOrder string
	}{
		{name: "replay only", bg: 4, wantOrder: "RRRR"},
		{name: "live only", live: 3, wantOrder: "LLL"},
		{name: "both: one replay in four", live: 7, bg: 3, wantOrder: "LLLRLLLRLR"},
		{name: "replay first in line, live overtakes", bg: 3, lateLive: 2, wantOrder: "RLLRR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{Policy: policy(0, 1)})
			s := newTestSched(p, nil)
			var seq uint64
			add := func(replay bool, n int) {
				for range n {
					seq++
					kind := "live"
					if replay {
						kind = "replay"
					}
					j := testJob(t, seq, fmt.Sprintf("http://a.test/%s/%d", kind, seq), "default")
					if replay {
						j.replay = &replayJob{run: "r1", of: seq}
					}
					if _, deferred := s.admit(t0, j); deferred {
						t.Fatalf("job %d deferred", seq)
					}
				}
			}
			add(false, tt.live)
			add(true, tt.bg)
			var order strings.Builder
			now := t0
			for i := 0; ; i++ {
				grants, _, _ := s.next(now)
				if len(grants) == 0 {
					break
				}
				g := grants[0]
				order.WriteString(map[bool]string{true: "R", false: "L"}[g.job.replay != nil])
				if i == 0 {
					add(false, tt.lateLive)
				}
				p.Done(now, g.permit, pacer.Response{Status: 200})
				s.finished(now, g.job, time.Millisecond, false)
				now = now.Add(time.Millisecond)
			}
			if got := order.String(); got != tt.wantOrder {
				t.Errorf("order %s, want %s", got, tt.wantOrder)
			}
			if s.held() != 0 {
				t.Errorf("%d jobs still held", s.held())
			}
		})
	}
}

// TestGrantsLiveFirst: while live jobs of an authority wait, a grant to
// another program (Worker.GrantLiveFirst) goes only after LiveFirstRun
// live starts since the last one, as a replay job does; with none waiting
// it goes at once.
func TestGrantsLiveFirst(t *testing.T) {
	tests := []struct {
		name      string
		live      int
		wantOrder string // L: a live job started, G: a grant allowed, before each live start
	}{
		{name: "no live jobs", live: 0, wantOrder: "G"},
		{name: "one grant in four", live: 7, wantOrder: "LLLGLLLGLG"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{Policy: policy(0, 1)})
			s := newTestSched(p, nil)
			w := &Worker{sched: s}
			for i := range tt.live {
				j := testJob(t, uint64(i+1), fmt.Sprintf("http://a.test/live/%d", i), "default")
				if _, deferred := s.admit(t0, j); deferred {
					t.Fatalf("job %d deferred", i)
				}
			}
			var order strings.Builder
			now := t0
			for {
				if d := w.GrantLiveFirst(now, "a.test:80"); d == 0 {
					order.WriteString("G")
				} else if d < 50*time.Millisecond {
					t.Errorf("a deferred grant is told to wait %v, want at least 50ms", d)
				}
				grants, _, _ := s.next(now)
				if len(grants) == 0 {
					break
				}
				order.WriteString("L")
				p.Done(now, grants[0].permit, pacer.Response{Status: 200})
				s.finished(now, grants[0].job, time.Millisecond, false)
				now = now.Add(time.Millisecond)
			}
			if got := order.String(); got != tt.wantOrder {
				t.Errorf("order %s, want %s", got, tt.wantOrder)
			}
		})
	}
}
