package policy

// DropWatch stops the watch Run follows, as a lost subscription ends it.
func (w *Watcher) DropWatch() {
	w.mu.Lock()
	kw := w.current
	w.mu.Unlock()
	if kw != nil {
		kw.Stop()
	}
}
