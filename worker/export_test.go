package worker

// SetFinalHook makes w call f with every job's final outcome (stored,
// unchanged, dead-lettered). Call it before Run.
func SetFinalHook(w *Worker, f func(Final)) { w.settler.onFinal = f }
