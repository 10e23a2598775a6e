//go:build !unix

package loadtest

import "os"

// cpuSeconds is not measured on this platform; the report shows 0.
func cpuSeconds() float64 { return 0 }

// maxRSS is not measured on this platform; the report shows 0.
func maxRSS(*os.ProcessState) uint64 { return 0 }
