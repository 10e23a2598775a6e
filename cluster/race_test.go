//go:build race

package cluster_test

// raceEnabled shortens the simulation under the race detector, which makes
// it about twenty times slower; the plain run covers every seed.
const raceEnabled = true
