//go:build !unix

package loadtest

// cpuSeconds is not measured on this platform; the report shows 0.
func cpuSeconds() float64 { return 0 }
