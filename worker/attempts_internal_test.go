package worker

import (
	"regexp"
	"testing"
)

// TestAttemptsKeysApart: a live job, its replay copies of two runs, and a
// job id that looks like a run's key each count their failed attempts
// under a key of their own, and every key is one a KV bucket takes.
func TestAttemptsKeysApart(t *testing.T) {
	kvKey := regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`) // nats.go's rule for KV keys
	tests := []struct {
		name    string
		run, id string
	}{
		{name: "live", id: "j1"},
		{name: "replay r1", run: "r1", id: "j1"},
		{name: "replay r2", run: "r2", id: "j1"},
		{name: "lone replay run", run: "0a1b2c-x_y", id: "j1"},
		{name: "live, an id with colons", id: "tenant:a.example:443/x"},
		{name: "replay, the same id", run: "r1", id: "tenant:a.example:443/x"},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := attemptsKey(tt.run, tt.id)
			if !kvKey.MatchString(k) {
				t.Errorf("key %q is not a KV key", k)
			}
			if other, ok := seen[k]; ok {
				t.Errorf("key %q is %s's too", k, other)
			}
			seen[k] = tt.name
		})
	}
	if got, want := attemptsKey("", "j1"), "j.ajE"; got != want {
		t.Errorf("a live job's key %q, want %q: the keys of counts already stored must not change", got, want)
	}
}
