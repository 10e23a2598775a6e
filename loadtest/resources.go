package loadtest

import (
	"runtime/metrics"
	"sync"
	"time"
)

// heapMetric is the live heap: bytes of heap objects, reachable or not yet
// swept. Its peak over a run is the closest runtime/metrics has to "peak
// memory" without a cgroup.
const heapMetric = "/memory/classes/heap/objects:bytes"

// heapSampler records the peak of heapMetric until stop.
type heapSampler struct {
	stopc chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	mu    sync.Mutex
	peak  uint64
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stopc: make(chan struct{})}
	h.sample()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-h.stopc:
				return
			case <-t.C:
				h.sample()
			}
		}
	}()
	return h
}

func (h *heapSampler) sample() {
	s := []metrics.Sample{{Name: heapMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	v := s[0].Value.Uint64()
	h.mu.Lock()
	h.peak = max(h.peak, v)
	h.mu.Unlock()
}

// stop ends sampling and returns the peak; it may be called more than once.
func (h *heapSampler) stop() uint64 {
	h.once.Do(func() { close(h.stopc) })
	h.wg.Wait()
	h.sample()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak
}
