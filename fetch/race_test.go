//go:build race

package fetch_test

// raceEnabled: the race detector allocates on its own, so allocation
// counts are only checked in the plain run.
const raceEnabled = true
