//go:build race

package worker_test

// raceEnabled shrinks the largest tests under the race detector, which makes
// them many times slower; the plain run keeps their full size.
const raceEnabled = true
