package lifecycle_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/lifecycle"
)

// recorder notes events in the order they happen.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) note(s string) {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
}

func (r *recorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// waiter is an actor that notes when it is told to stop and when it
// returns.
func waiter(r *recorder, name string) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		r.note(name + " told")
		r.note(name + " returned")
		return nil
	}
}

func TestStopReachesStagesInOrder(t *testing.T) {
	var r recorder
	g := lifecycle.New(zerolog.Nop(), 0, "work", "conn", "admin")
	// Added in the reverse of the stop order: the order is the stages', not
	// the calls'.
	g.Add(2, "admin", waiter(&r, "admin"))
	g.Add(1, "conn", waiter(&r, "conn"))
	g.Add(0, "worker", waiter(&r, "worker"))
	g.Add(0, "intake", waiter(&r, "intake"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil after a stop asked for", err)
	}
	got := r.events()
	pos := func(s string) int { return slices.Index(got, s) }
	for _, tt := range []struct{ before, after string }{
		{"worker returned", "conn told"},
		{"intake returned", "conn told"},
		{"conn returned", "admin told"},
	} {
		if b, a := pos(tt.before), pos(tt.after); b < 0 || a < 0 || b > a {
			t.Errorf("%q at %d, %q at %d, want the first before the second: %v", tt.before, b, tt.after, a, got)
		}
	}
}

func TestLaterStageRunsUntilEarlierReturned(t *testing.T) {
	g := lifecycle.New(zerolog.Nop(), 0, "work", "conn")
	release := make(chan struct{})
	connCtx := make(chan context.Context, 1)
	sawConnDone := make(chan bool, 1)
	g.Add(1, "conn", func(ctx context.Context) error {
		connCtx <- ctx
		<-ctx.Done()
		return nil
	})
	g.Add(0, "worker", func(ctx context.Context) error {
		c := <-connCtx
		<-ctx.Done()
		<-release // a long grace
		sawConnDone <- c.Err() != nil
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	cancel()
	close(release)
	if <-sawConnDone {
		t.Error("conn was told to stop while the worker still ran")
	}
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestAddWhileRunning(t *testing.T) {
	var r recorder
	g := lifecycle.New(zerolog.Nop(), 0, "work", "conn")
	added := make(chan error, 1)
	g.Add(1, "conn", func(ctx context.Context) error {
		// Start-up: the worker exists once NATS is reached.
		added <- g.Add(0, "worker", waiter(&r, "worker"))
		<-ctx.Done()
		r.note("conn told")
		// Stopping: the worker's stage is over; a part added now is refused.
		if err := g.Add(0, "late", waiter(&r, "late")); !errors.Is(err, lifecycle.ErrStopping) {
			t.Errorf("Add after the stage stopped = %v, want ErrStopping", err)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	if err := <-added; err != nil {
		t.Fatalf("Add while running: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got, want := r.events(), []string{"worker told", "worker returned", "conn told"}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

func TestRunError(t *testing.T) {
	boom, stuck := errors.New("boom"), errors.New("stuck while stopping")
	tests := []struct {
		name    string
		stop    bool // the caller asks for the stop
		work    error
		workEnd bool // work returns before the stop (else when told)
		conn    error
		want    error
	}{
		{name: "stop asked, all clean", stop: true},
		{name: "work fails first", work: boom, workEnd: true, want: boom},
		{name: "work ends with nil first", workEnd: true},
		{name: "work fails while stopping", stop: true, work: stuck, want: stuck},
		{name: "a later stage's error while stopping is not the run's", stop: true, conn: stuck},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := lifecycle.New(zerolog.Nop(), 0, "work", "conn")
			g.Add(0, "work", func(ctx context.Context) error {
				if !tt.workEnd {
					<-ctx.Done()
				}
				return tt.work
			})
			g.Add(1, "conn", func(ctx context.Context) error { <-ctx.Done(); return tt.conn })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.stop {
				cancel()
			}
			if err := g.Run(ctx); !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Errorf("Run = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestActorsKeepTheContextsValues(t *testing.T) {
	type key struct{}
	g := lifecycle.New(zerolog.Nop(), 0, "work")
	var got any
	g.Add(0, "work", func(ctx context.Context) error { got = ctx.Value(key{}); return nil })
	if err := g.Run(context.WithValue(context.Background(), key{}, "stop-now")); err != nil {
		t.Fatal(err)
	}
	if got != "stop-now" {
		t.Errorf("value %v, want stop-now", got)
	}
}
