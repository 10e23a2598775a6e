package cluster

// Releasing reports how many of m's partitions are being given up and
// whose Release hook has not returned yet (its goroutine may not have
// called it yet). A simulation on a fake clock waits for it to reach 0
// after each Step, so that every Release runs at the instant the Manager
// decided it rather than whenever the scheduler runs its goroutine.
func (m *Manager) Releasing() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, l := range m.owned {
		if !l.releasing {
			continue
		}
		select {
		case <-l.released:
		default:
			n++
		}
	}
	return n
}
