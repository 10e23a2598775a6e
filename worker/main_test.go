package worker_test

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// waitingParallel is how many of the tests that call t.Parallel run at once
// when go test is not told (-parallel): as many as `make test` runs
// (PARALLEL). They mostly wait, on JetStream and loopback origins, so
// GOMAXPROCS (go test's default, 2 on a 2-core machine) left the CPUs idle
// and doubled the package's wall time.
const waitingParallel = 8

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(waitingParallel)); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
