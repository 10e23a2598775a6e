package loadtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// trace keeps one strategy's per-request record (Options.TraceDir): the
// origin's arrivals and the pods' departure logs. A nil *trace keeps
// nothing. Safe for concurrent use.
type trace struct {
	dir string
	mu  sync.Mutex
	f   *os.File // arrivals.log
}

// openTrace makes root/name and opens its arrivals.log; an empty root
// returns nil (no trace).
func openTrace(root, name string) (*trace, error) {
	if root == "" {
		return nil, nil
	}
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("trace dir: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "arrivals.log"))
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	return &trace{dir: dir, f: f}, nil
}

// arrival returns the origin's OnArrival hook, nil for a nil trace. Each
// request is one line, in the order the origin's handlers ran:
//
//	<arrived unix ns> <handled unix ns> <authority> <identity> <remote addr> <outcome>
//
// arrived is the kernel's receive time (stuborigin.Arrival), handled the
// handler's clock; outcome is stuborigin.Outcome as a number (0 admitted).
func (t *trace) arrival() func(stuborigin.Arrival) {
	if t == nil {
		return nil
	}
	return func(a stuborigin.Arrival) {
		line := strconv.AppendInt(nil, a.Arrived.UnixNano(), 10)
		line = append(line, ' ')
		line = strconv.AppendInt(line, a.Handled.UnixNano(), 10)
		line = fmt.Appendf(line, " %d %s %s %d\n", a.Authority, a.Identity, a.Remote, a.Outcome)
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.f != nil {
			t.f.Write(line) // best effort: a trace, not a measurement
		}
	}
}

// keep copies the file at path into the trace as name; a missing file
// (a pod that sent nothing) is skipped.
func (t *trace) keep(path, name string) error {
	if t == nil {
		return nil
	}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := os.WriteFile(filepath.Join(t.dir, name), b, 0o644); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}

func (t *trace) close() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.f.Close()
	t.f = nil
}
