package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/cluster"
)

type nopHooks struct{}

func (nopHooks) Acquired(context.Context, int, time.Time) error { return nil }
func (nopHooks) Release(context.Context, int)                   {}
func (nopHooks) Status() []byte                                 { return nil }

// BenchmarkOwns is the whole per-request cost of cluster coordination: the
// lease check before a request starts (no NATS round trip).
func BenchmarkOwns(b *testing.B) {
	clk := clock.NewFake(time.Now())
	m, err := cluster.New(newMemStore(clk, 6*time.Second), newMemStore(clk, 6*time.Second), nopHooks{},
		cluster.Options{PodID: "p", Partitions: 32, TTL: 6 * time.Second, Clock: clock.Real{}, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	m.Step(context.Background())
	if len(m.Owned()) != 32 {
		b.Fatalf("owns %v", m.Owned())
	}
	b.ResetTimer()
	for i := range b.N {
		if !m.Owns(i & 31) {
			b.Fatal("lost")
		}
	}
}
