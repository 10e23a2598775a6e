package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/worker"
)

func streamMsgs(t testing.TB, e *env, name string) uint64 {
	t.Helper()
	s, err := e.js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// isRound selects the stored jobs whose id starts with round-.
func isRound(round string) func(worker.Final) bool {
	return func(f worker.Final) bool {
		return strings.HasPrefix(f.JobID, round+"-") && f.Outcome == worker.OutcomeStored
	}
}

func waitCond(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
