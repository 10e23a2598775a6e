package bandwidth_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/bandwidth"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func auth(t *testing.T, hostport string) authority.Authority {
	t.Helper()
	a, err := authority.Parse("http://" + hostport)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func capped(def int64, byAuth map[string]int64) *pacer.Policy {
	p := &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2, Bandwidth: def}, Authorities: map[string]pacer.Limits{}}
	for a, r := range byAuth {
		p.Authorities[a] = pacer.Limits{Floor: time.Second, MaxInFlight: 2, Bandwidth: r}
	}
	return p
}

func TestBurst(t *testing.T) {
	for _, tt := range []struct {
		rate int64
		want int
	}{
		{rate: 1 << 10, want: bandwidth.MinBurst},
		{rate: 64 << 10, want: 4 << 10},
		{rate: 1 << 20, want: 64 << 10},
		{rate: 1 << 30, want: bandwidth.MaxBurst},
	} {
		if got := bandwidth.Burst(tt.rate); got != tt.want {
			t.Errorf("Burst(%d) = %d, want %d", tt.rate, got, tt.want)
		}
	}
}

// grant is one Wait's result at the fake instant it returned.
type grant struct {
	at     time.Time
	reader int
	n      int
}

// readers run one goroutine per throttle, each asking for ask bytes over
// and over; the test's loop advances the fake clock by step only once every
// reader is blocked on a timer, so every grant is recorded at the exact
// fake instant it came. It stops at until.
func readers(t *testing.T, clk *clock.Fake, ths []fetch.BodyThrottle, ask int, step time.Duration, until time.Time, change func(now time.Time)) []grant {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // also on a t.Fatalf: readers that never block spin otherwise
	var (
		mu     sync.Mutex
		grants []grant
		wg     sync.WaitGroup
	)
	for i, th := range ths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n, err := th.Wait(ctx, ask)
				if err != nil {
					return
				}
				if n < 1 || n > ask {
					t.Errorf("Wait(%d) granted %d", ask, n)
				}
				mu.Lock()
				grants = append(grants, grant{at: clk.Now(), reader: i, n: n})
				mu.Unlock()
			}
		}()
	}
	for clk.Now().Before(until) {
		deadline := time.Now().Add(10 * time.Second)
		for clk.Timers() < len(ths) {
			if time.Now().After(deadline) {
				t.Fatalf("readers not all waiting at %v: %d timers", clk.Now().Sub(t0), clk.Timers())
			}
			time.Sleep(50 * time.Microsecond)
		}
		if change != nil {
			change(clk.Now())
		}
		clk.Advance(step)
	}
	cancel()
	clk.Advance(time.Hour) // wake the last waits; they see ctx done or return
	wg.Wait()
	return grants
}

// maxOver is the most bytes granted in any window of d starting at a grant
// at or after from.
func maxOver(gs []grant, d time.Duration, from time.Time) int {
	best := 0
	for i, g := range gs {
		if g.at.Before(from) {
			continue
		}
		sum := 0
		for _, h := range gs[i:] {
			if !h.at.Before(g.at.Add(d)) {
				break
			}
			sum += h.n
		}
		best = max(best, sum)
	}
	return best
}

func sum(gs []grant) (n int) {
	for _, g := range gs {
		n += g.n
	}
	return n
}

// TestAuthorityCapOverItsBodies: three bodies of one authority capped at
// 1 MiB/s share the one bucket: over any second they are granted at most
// the cap plus one burst, and over 4 s they get the cap's worth (the
// bucket wastes nothing). A body of another authority is not held back.
func TestAuthorityCapOverItsBodies(t *testing.T) {
	clk := clock.NewFake(t0)
	const capped1 = 1 << 20
	c, err := bandwidth.New(&bandwidth.Options{Clock: clk, Policy: capped(0, map[string]int64{"files.example:80": capped1})})
	if err != nil {
		t.Fatal(err)
	}
	a := auth(t, "files.example:80")
	ths := []fetch.BodyThrottle{c.Body(a), c.Body(a), c.Body(a)}
	gs := readers(t, clk, ths, 32<<10, time.Millisecond, t0.Add(4*time.Second), nil)
	limit := capped1 + bandwidth.Burst(capped1)
	if got := maxOver(gs, time.Second, t0); got > limit {
		t.Errorf("granted %d bytes in one second, above the cap plus one burst (%d)", got, limit)
	}
	if got, want := sum(gs), 4*capped1; got < want-bandwidth.Burst(capped1) || got > want+bandwidth.Burst(capped1)+3*(32<<10) {
		t.Errorf("granted %d bytes in 4 s, want about %d", got, want)
	}
	per := map[int]int{}
	for _, g := range gs {
		per[g.reader] += g.n
	}
	for i := range ths {
		if per[i] < capped1/2 {
			t.Errorf("body %d got %d bytes of %d: the bucket is not shared", i, per[i], sum(gs))
		}
	}
	other := c.Body(auth(t, "other.example:80"))
	if n, err := other.Wait(context.Background(), 1<<20); err != nil || n != 1<<20 {
		t.Errorf("uncapped authority: Wait = %d, %v; want all at once", n, err)
	}
}

// TestPodCapOverEveryAuthority: the pod's cap holds over bodies of
// authorities that have none of their own.
func TestPodCapOverEveryAuthority(t *testing.T) {
	clk := clock.NewFake(t0)
	const podCap = 256 << 10
	c, err := bandwidth.New(&bandwidth.Options{Clock: clk, PodLimit: podCap})
	if err != nil {
		t.Fatal(err)
	}
	ths := []fetch.BodyThrottle{c.Body(auth(t, "a.example:80")), c.Body(auth(t, "b.example:80"))}
	gs := readers(t, clk, ths, 32<<10, time.Millisecond, t0.Add(3*time.Second), nil)
	if got, limit := maxOver(gs, time.Second, t0), podCap+bandwidth.Burst(podCap); got > limit {
		t.Errorf("granted %d bytes in one second over the pod, above %d", got, limit)
	}
	if _, err := bandwidth.New(&bandwidth.Options{PodLimit: 10}); err == nil {
		t.Error("a pod cap of 10 B/s was accepted")
	}
}

// TestSetPolicyAppliesFromTheNextRead: a body capped at 1 MiB/s is held to
// 128 KiB/s from the change on, and uncapped when the cap is removed.
func TestSetPolicyAppliesFromTheNextRead(t *testing.T) {
	clk := clock.NewFake(t0)
	c, err := bandwidth.New(&bandwidth.Options{Clock: clk, Policy: capped(1<<20, nil)})
	if err != nil {
		t.Fatal(err)
	}
	th := c.Body(auth(t, "files.example:80"))
	changeAt := t0.Add(2 * time.Second)
	changed := false
	gs := readers(t, clk, []fetch.BodyThrottle{th}, 16<<10, time.Millisecond, t0.Add(5*time.Second), func(now time.Time) {
		if !changed && !now.Before(changeAt) {
			c.SetPolicy(capped(128<<10, nil))
			changed = true
		}
	})
	// The first read after the change may still come on the old rate's
	// reservation (at most one burst of it), then the new rate holds.
	after := changeAt.Add(100 * time.Millisecond)
	if got, limit := maxOver(gs, time.Second, after), 128<<10+bandwidth.Burst(128<<10); got > limit {
		t.Errorf("after the change: %d bytes in one second, above %d", got, limit)
	}
	if got := maxOver(gs, time.Second, t0.Add(500*time.Millisecond)); got < 512<<10 {
		t.Errorf("before the change: at most %d bytes in a second, want the 1 MiB/s cap's worth", got)
	}
	c.SetPolicy(capped(0, nil))
	if n, err := th.Wait(context.Background(), 8<<20); err != nil || n != 8<<20 {
		t.Errorf("cap removed: Wait = %d, %v; want all at once", n, err)
	}
	if clk.Timers() != 0 {
		t.Errorf("%d timers armed after an uncapped Wait", clk.Timers())
	}
}

// TestCancelledWaitReturnsCtxError: a wait ended by its context returns
// the context's error and no bytes.
func TestCancelledWaitReturnsCtxError(t *testing.T) {
	clk := clock.NewFake(t0)
	c, err := bandwidth.New(&bandwidth.Options{Clock: clk, Policy: capped(1<<10, nil)})
	if err != nil {
		t.Fatal(err)
	}
	th := c.Body(auth(t, "files.example:80"))
	if n, err := th.Wait(context.Background(), 4<<10); err != nil || n != bandwidth.MinBurst {
		t.Fatalf("first Wait = %d, %v; want one burst (%d) at once", n, err, bandwidth.MinBurst)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := th.Wait(ctx, 4<<10); done <- err }()
	for clk.Timers() == 0 {
		time.Sleep(50 * time.Microsecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait: %v", err)
	}
	th.Close()
	th.Close() // twice is once
}

// TestIdleBucketsAreForgotten: buckets of authorities without bodies are
// dropped once full, so a pod that passes many authorities holds few.
func TestIdleBucketsAreForgotten(t *testing.T) {
	clk := clock.NewFake(t0)
	c, err := bandwidth.New(&bandwidth.Options{Clock: clk, Policy: capped(64<<10, nil)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		th := c.Body(auth(t, "h"+strconv.Itoa(i)+".example:80"))
		if _, err := th.Wait(context.Background(), 1<<10); err != nil { // a part of the bucket spent
			t.Fatal(err)
		}
		th.Close()
		clk.Advance(10 * time.Millisecond) // the older buckets refill meanwhile
	}
	if n := bandwidth.Tracked(c); n > 200 {
		t.Errorf("%d buckets held after 1000 authorities came and went", n)
	}
}
